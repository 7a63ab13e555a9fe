"""The ``--weights`` option the benches that run the demo model share: its flag, and the model it names."""

from __future__ import annotations

import argparse

__all__ = ["add_weights_arg", "demo_model_from"]


def add_weights_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weights", default="auto", help="demo model weights: auto, a .safetensors path, or random (the seeded init)"
    )


def demo_model_from(args: argparse.Namespace):
    """The demo model ``args.weights`` names (``random``: the seeded init, no weights file)."""
    from sakura_core.models.edit_model import load_demo_model

    return load_demo_model(weights=None if args.weights == "random" else args.weights)
