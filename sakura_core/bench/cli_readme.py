"""``sakura bench readme``: regenerate the README's measured-results sections from the committed benchmark JSON
(``docs/results/``); ``--check`` only compares (exit 1 when a section is stale)."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

from pathlib import Path

from .readme import update_readme

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--root", default=".", help="the repository root (default: the current folder)")
    parser.add_argument("--readme", default="README.md", help="the README, relative to --root")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a section is stale")


def run(args) -> int:
    root = Path(args.root)
    changed = update_readme(root / args.readme, root, check=args.check)
    if args.check:
        if changed:
            print(f"stale README sections: {', '.join(changed)}; run `sakura bench readme` and commit the result")
            return 1
        print("README measured results match docs/results/")
        return 0
    print(f"rewrote sections: {', '.join(changed)}" if changed else "README already up to date")
    return 0
