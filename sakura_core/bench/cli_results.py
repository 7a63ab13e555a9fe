"""``sakura bench results`` (alias ``sakura bench readme``): regenerate docs/results.md's measured-results sections
from the committed benchmark JSON (``docs/results/``); ``--check`` only compares (exit 1 when a section is stale)."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

from pathlib import Path

from .results_doc import DOC, update_doc

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--root", default=".", help="the repository root (default: the current folder)")
    parser.add_argument("--doc", default=DOC, help="the document, relative to --root (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a section is stale")


def run(args) -> int:
    root = Path(args.root)
    doc = root / args.doc
    if not doc.is_file():
        print(f"sakura bench results: no {doc} (give the repository root with --root)")
        return 2
    changed = update_doc(doc, root, check=args.check)
    if args.check:
        if changed:
            print(
                f"stale sections of {args.doc}: {', '.join(changed)}; run `sakura bench results` and commit the result"
            )
            return 1
        print(f"{args.doc}'s measured results match docs/results/")
        return 0
    print(f"rewrote sections of {args.doc}: {', '.join(changed)}" if changed else f"{args.doc} already up to date")
    return 0
