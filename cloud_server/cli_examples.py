"""``sakura examples``: publish the example templates the shipped ComfyUI workflows use into a store, and write their
example user images into ComfyUI's input folder."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import sys
from pathlib import Path

from .examples import TEMPLATES, publish_examples, write_user_images
from .store import StoreError
from .store_url import add_store_arguments, add_store_profile_argument, check_store_location, is_s3_url, open_store

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    add_store_arguments(parser, what="store to publish the example templates into")
    parser.add_argument(
        "--comfyui-input", help="ComfyUI's input folder (ComfyUI/input) to write the example user images into"
    )
    parser.add_argument(
        "--template",
        action="append",
        choices=sorted(TEMPLATES),
        help="publish only this example template (repeatable; default: all)",
    )
    add_store_profile_argument(parser)


def run(args) -> int:
    folder = Path(args.comfyui_input).expanduser() if args.comfyui_input else None
    if folder is not None and not folder.is_dir() and not folder.parent.is_dir():
        print(f"sakura examples: {folder.parent} does not exist; give ComfyUI's input folder", file=sys.stderr)
        return 2
    try:
        location = check_store_location(args.store)
        location = location if is_s3_url(location) else str(Path(location).expanduser())
        store = open_store(location, endpoint_url=args.s3_endpoint)
        done = publish_examples(store, template_ids=args.template, store_profile=args.store_profile)
    except (ValueError, StoreError) as e:
        print(f"sakura examples: {e}", file=sys.stderr)
        return 2
    for template_id in args.template or TEMPLATES:
        print(f"{template_id}: {'published' if template_id in done else 'already published'} in {location}")
    if folder is not None:
        for path in write_user_images(folder):
            print(f"wrote {path}")
    endpoint = f" --s3-endpoint {args.s3_endpoint}" if args.s3_endpoint else ""
    print(
        f"next: sakura serve --store {location}{endpoint} --port 8080   (the example workflows expect "
        "http://127.0.0.1:8080)"
    )
    return 0
