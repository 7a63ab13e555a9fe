"""Formats the repository: strips the ``# fmt: skip`` markers that carry no reason, then runs ``ruff format``.

Run from anywhere: ``python tests/support/format_repo.py`` (``make format`` does it with the venv's Python). A marker
stays only when it says why, as ``# fmt: skip # keep: <reason>`` (ruff still honours the first pragma); every other
``# fmt: skip`` comment is removed, keeping any words after it, and ruff then formats the statement it guarded.
Only comment tokens are touched, so a string that spells the marker is left alone. Running it twice changes nothing
the second time. ``tests/test_layering.py`` counts the markers left (:func:`count_markers`).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

__all__ = ["KEEP", "count_markers", "main", "python_files", "strip_markers"]

ROOT = Path(__file__).resolve().parents[2]
KEEP = "# keep:"
EXCLUDED_DIRS = {".venv", "node_modules", ".git", "sakura-demo-out", "__pycache__"}
_BARE = re.compile(r"^#\s*fmt:\s*skip\b\s*(?P<rest>.*)$")


def python_files(root: Path = ROOT) -> list[Path]:
    """The repository's Python files, outside the venv, node_modules and build output, sorted."""
    return sorted(p for p in root.rglob("*.py") if not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1]))


def _marker_comments(source: str) -> list[tokenize.TokenInfo]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [t for t in tokens if t.type == tokenize.COMMENT and _BARE.match(t.string)]


def count_markers(paths: list[Path]) -> dict[str, list[tuple[int, str]]]:
    """``{path: [(line, reason), ...]}`` of the ``# fmt: skip`` comments in ``paths``; ``reason`` is what follows
    ``# keep:`` ("" for a bare marker, which :func:`strip_markers` removes)."""
    found = {}
    for path in paths:
        tokens = _marker_comments(path.read_text(encoding="utf-8"))
        if tokens:
            found[str(path)] = [(t.start[0], _reason(t.string)) for t in tokens]
    return found


def _reason(comment: str) -> str:
    rest = _BARE.match(comment)["rest"]
    return rest.removeprefix(KEEP).strip() if rest.startswith(KEEP) else ""


def strip_markers(source: str) -> str:
    """``source`` without its ``# fmt: skip`` comments that carry no ``# keep:`` reason."""
    lines = source.splitlines(keepends=True)
    for tok in reversed(_marker_comments(source)):
        rest = _BARE.match(tok.string)["rest"]
        if rest.startswith(KEEP):
            continue
        row, col = tok.start
        line = lines[row - 1]
        end = tok.end[1]
        before = line[:col].rstrip() if not rest else line[:col]
        replacement = f"# {rest.lstrip('# ')}" if rest else ""
        lines[row - 1] = before + replacement + line[end:]
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Strip the markers in every Python file of the repository (or those named), then ``ruff format`` them."""
    named = [Path(a).resolve() for a in (argv if argv is not None else sys.argv[1:])]
    paths = named or python_files()
    changed = 0
    for path in paths:
        text = path.read_text(encoding="utf-8")
        new = strip_markers(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed += 1
    sys.stderr.write(f"stripped markers in {changed} files\n")
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        sys.stderr.write("ruff not found beside this Python nor on PATH: `make test` installs it into .venv\n")
        return 2
    # With no files named, ruff walks the tree itself and honours pyproject.toml's excludes.
    targets = [str(p) for p in named] or ["."]
    return subprocess.run([ruff, "format", *targets], cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
