"""``sakura examples``: publish the example templates the shipped ComfyUI workflows use into a store, and write their
example user images into ComfyUI's input folder."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import sys
from pathlib import Path

from .examples import TEMPLATES, publish_examples, write_user_images

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--store", required=True, help="store folder to publish the example templates into (created)")
    parser.add_argument(
        "--comfyui-input", help="ComfyUI's input folder (ComfyUI/input) to write the example user images into"
    )
    parser.add_argument(
        "--template",
        action="append",
        choices=sorted(TEMPLATES),
        help="publish only this example template (repeatable; default: all)",
    )


def run(args) -> int:
    store = Path(args.store).expanduser()
    folder = Path(args.comfyui_input).expanduser() if args.comfyui_input else None
    if folder is not None and not folder.is_dir() and not folder.parent.is_dir():
        print(f"sakura examples: {folder.parent} does not exist; give ComfyUI's input folder", file=sys.stderr)
        return 2
    try:
        done = publish_examples(store, template_ids=args.template)
    except ValueError as e:
        print(f"sakura examples: {e}", file=sys.stderr)
        return 2
    for template_id in args.template or TEMPLATES:
        print(f"{template_id}: {'published' if template_id in done else 'already published'} in {store}")
    if folder is not None:
        for path in write_user_images(folder):
            print(f"wrote {path}")
    print(f"next: sakura serve --store {store} --port 8080   (the example workflows expect http://127.0.0.1:8080)")
    return 0
