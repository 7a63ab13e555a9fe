"""A folder tree the tests' own process really cannot write (issue 28: read-only stores, CLI outputs on a read-only
disk). Without root a tree made ``a-w`` (EACCES); as root (who ignores modes) the folders are marked immutable
with ``chattr +i`` (EPERM). Either is undone on exit; without either the test skips, saying why."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["read_only"]


def _folders(root: Path) -> list[Path]:
    return [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]


@contextlib.contextmanager
def read_only(root: str | os.PathLike):
    """Within the block no file can be created, renamed or removed in ``root`` or any folder below it."""
    folders = _folders(Path(root))
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in folders}
        for p in folders:
            p.chmod(modes[p] & ~0o222)
        try:
            yield "EACCES"
        finally:
            for p in folders:
                p.chmod(modes[p])
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("running as root without chattr (e2fsprogs): cannot make a folder read-only for this process")
    done = []
    try:
        for p in folders:
            if subprocess.run([chattr, "+i", str(p)], capture_output=True).returncode != 0:
                pytest.skip(f"running as root and `chattr +i` fails on {p}'s file system: cannot make it read-only")
            done.append(p)
        yield "EPERM"
    finally:
        for p in reversed(done):
            subprocess.run([chattr, "-i", str(p)], check=True)
