"""The benches' ``--requests ahead|sequential`` flag: how the fetch lane sends its requests, simulated and live
(``SimConfig`` / ``RuntimeConfig.request_ahead``)."""

__all__ = ["add_requests_argument", "requests_ahead"]


def add_requests_argument(parser) -> None:
    """``--requests ahead|sequential``: the fetch lane's requests (``SimConfig`` / ``RuntimeConfig.request_ahead``)."""
    parser.add_argument(
        "--requests",
        choices=["ahead", "sequential"],
        default="ahead",
        help="the fetch lane's requests, sim and "
        "live: 'ahead' (default, as the live lane's: the next leaves once the bytes on their way are within two round "
        "trips of the link) or 'sequential' (each once the transfer before has arrived, paying its round trip)",
    )


def requests_ahead(args) -> bool:
    """Whether ``--requests`` (:func:`add_requests_argument`) sends requests ahead; a namespace without it takes the
    default, ahead."""
    return getattr(args, "requests", "ahead") == "ahead"
