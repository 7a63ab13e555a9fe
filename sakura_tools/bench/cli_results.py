"""``sakura bench results`` (alias ``sakura bench readme``): regenerate every generated results table from the
committed benchmark JSON (``docs/results/``): docs/results.md's and the README's in one command (``--doc``: one
document only); ``--check`` only compares (exit 1 when a section is stale)."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

from pathlib import Path

from .results_doc import DOCS, update_doc

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--root", default=".", help="the repository root (default: the current folder)")
    parser.add_argument("--doc", help=f"one document, relative to --root (default: every one, {', '.join(DOCS)})")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a section is stale")


def run(args) -> int:
    root = Path(args.root)
    names = [args.doc] if args.doc else list(DOCS)
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        print(
            f"sakura bench results: no {', '.join(str(root / n) for n in missing)} (give the repository root with "
            "--root)"
        )
        return 2
    stale = []
    for name in names:
        changed = update_doc(root / name, root, check=args.check)
        stale += [f"{name}: {', '.join(changed)}"] if changed else []
        if not args.check:
            print(f"rewrote sections of {name}: {', '.join(changed)}" if changed else f"{name} already up to date")
    if args.check:
        if stale:
            print(f"stale sections of {'; '.join(stale)}; run `sakura bench results` and commit the result")
            return 1
        print(f"{', '.join(names)}: the measured results match docs/results/")
    return 0
