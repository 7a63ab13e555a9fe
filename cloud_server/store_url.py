"""``--store`` values: a local folder or ``s3://bucket/prefix``, opened as the matching ``Store``.

Every command that takes ``--store`` (serve, precompute, precompute-catalog, store verify|repair, examples, bench
catalog) opens it here, with the same ``--s3-endpoint`` flag. S3 credentials come from the AWS variables.
"""

from __future__ import annotations

import os
from pathlib import Path

from sakura_core.kv.storage import DEFAULT_STORE_PROFILE, STORE_PROFILES

from .store import LocalStore, Store

__all__ = [
    "S3_ENDPOINT_HELP",
    "add_s3_limit_arguments",
    "add_store_arguments",
    "add_store_profile_argument",
    "check_store_location",
    "is_s3_url",
    "open_store",
    "s3_config_from_args",
]

S3_ENDPOINT_HELP = (
    "S3 endpoint URL for an s3:// store (default: $AWS_ENDPOINT_URL_S3 / $AWS_ENDPOINT_URL, else AWS); credentials "
    "from $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY (or a profile)"
)


def is_s3_url(location: str | os.PathLike) -> bool:
    return isinstance(location, str) and location.startswith("s3://")


def check_store_location(location: str | os.PathLike) -> str:
    """``location`` as text after checking it is a folder path or a well-formed ``s3://`` URL (``ValueError``)."""
    text = os.fspath(location)
    if is_s3_url(text):
        from .s3_store import parse_s3_url

        parse_s3_url(text)
        return text
    scheme, sep, _ = text.partition("://")
    if sep and scheme.isalnum():
        raise ValueError(f"store {text[:80]!r}: unsupported scheme {scheme!r}; use a folder or s3://BUCKET/PREFIX")
    return text


def open_store(location: str | os.PathLike, *, endpoint_url: str | None = None, s3_config=None) -> Store:
    """A ``LocalStore`` for a folder (created if missing), an ``S3Store`` for ``s3://bucket/prefix`` (with
    ``s3_config``, an ``S3Config``: its timeouts and retries; default ``S3Config()``).

    ``ValueError`` for another URL scheme or a malformed S3 URL (the message names the fix).
    """
    text = check_store_location(location)
    if is_s3_url(text):
        from .s3_store import S3Store

        return S3Store(text, endpoint_url=endpoint_url, config=s3_config)
    if endpoint_url is not None:
        raise ValueError(f"--s3-endpoint is only for s3:// stores, but the store is the folder {text!r}")
    return LocalStore(Path(text))


def add_store_arguments(parser, *, what: str = "store") -> None:
    """``--store`` (required) and ``--s3-endpoint``."""
    parser.add_argument("--store", required=True, help=f"{what}: a folder (created if missing) or s3://BUCKET/PREFIX")
    parser.add_argument("--s3-endpoint", default=None, help=S3_ENDPOINT_HELP)


def add_s3_limit_arguments(parser) -> None:
    """``--s3-connect-timeout``, ``--s3-read-timeout``, ``--s3-attempts``: an S3 store's per-request limits."""
    parser.add_argument(
        "--s3-connect-timeout",
        type=float,
        default=5.0,
        help="seconds to connect to the S3 endpoint (default: %(default)s)",
    )
    parser.add_argument(
        "--s3-read-timeout",
        type=float,
        default=10.0,
        help="seconds one wait for bytes from S3 may last (default: %(default)s)",
    )
    parser.add_argument(
        "--s3-attempts", type=int, default=2, help="tries of one S3 request, the first included (default: %(default)s)"
    )


def s3_config_from_args(args):
    """The ``S3Config`` of :func:`add_s3_limit_arguments`' flags (``ValueError`` naming a bad one)."""
    from .s3_io import S3Config

    return S3Config(args.s3_connect_timeout, args.s3_read_timeout, args.s3_attempts)


def add_store_profile_argument(parser) -> None:
    """``--store-profile serving|full``: what a command that publishes templates keeps of each
    (``sakura_core.precompute.store_profile``)."""
    parser.add_argument(
        "--store-profile",
        choices=STORE_PROFILES,
        default=DEFAULT_STORE_PROFILE,
        help="what the store keeps: serving = the rungs a client fetches (the floor up to a near-lossless top rung; "
        "per-step: the twins' track and the open-loop floor), no fp16; full = every representation, the exact fp16 "
        "included (the fetch-fp16 baseline, exactness tests) (default: %(default)s)",
    )
