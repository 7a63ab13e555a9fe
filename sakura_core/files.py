"""Files written whole or not at all (temp file + fsync + rename), and PNG output: shared by the CLIs, the store, the
servers and the benchmarks."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = [
    "DISK_FAULTS",
    "atomic_create_bytes",
    "atomic_write_bytes",
    "atomic_write_json",
    "cache_root",
    "disk_fault_message",
    "folder_write_problem",
    "output_problem",
    "png_bytes",
    "save_png",
]


def cache_root() -> Path:
    """Where SAKURA keeps what it can rebuild (training checkpoints, the live bench's template store), outside the
    repository: ``$SAKURA_CACHE_DIR``, else ``~/.cache/sakura``."""
    return Path(os.environ.get("SAKURA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sakura"))


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: read by setting it back at once (start-up, before threads)
    os.umask(mask)
    return mask


_UMASK = _umask()


def _write_temp(path: Path, data: bytes) -> str:
    """``data`` in a fsynced temp file beside ``path``, with the mode a plain ``open`` would give (0666 less the
    umask: mkstemp's 0600 would hide a store from a CDN origin running as another user); returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder + fsync + rename.

    A crash at any point leaves either the old file or the new one, never a partial file under ``path``.
    """
    path = Path(path)
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_create_bytes(path: str | Path, data: bytes) -> None:
    """:func:`atomic_write_bytes` that never replaces a file: ``FileExistsError`` when ``path`` exists, also when
    another writer creates it at the same moment (a hard link of the temp file, which the kernel refuses to put
    over an existing name)."""
    path = Path(path)
    tmp = _write_temp(path, data)
    try:
        os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


#: errnos of a disk that cannot take a write: full, over quota, read-only, no permission.
DISK_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _errno_name(e: OSError) -> str | int | None:
    """``ENOSPC`` for an OSError of that errno (its number when the name is unknown, None without an errno)."""
    if e.errno is None:
        return None
    return errno.errorcode.get(e.errno, e.errno)


def disk_fault_message(e: OSError) -> str:
    """One line for a :data:`DISK_FAULTS` error: the file, the reason and its errno name, and what to do."""
    where = f"{e.filename}: " if e.filename else ""
    fix = (
        "free some space"
        if e.errno in (errno.ENOSPC, errno.EDQUOT)
        else "use a folder this user can write, or fix its permissions"
    )
    return f"{where}{e.strerror} ({_errno_name(e)}): {fix}, and run it again (files are written whole or not at all)"


def folder_write_problem(folder: str | Path) -> str | None:
    """Why files cannot be created in ``folder`` (``folder: strerror (ERRNO)``), or ``None``: a probe file is created
    and removed (``os.access`` is no test: root passes it on a read-only mount or an immutable folder)."""
    folder = Path(folder)
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", suffix=".tmp", dir=folder)
    except OSError as e:
        return f"{folder}: {e.strerror} ({_errno_name(e)})"
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError as e:
        return f"{folder}: a file created there cannot be removed: {e.strerror}"
    return None


def output_problem(path: str | Path) -> str | None:
    """Why a CLI could not write its output file ``path`` (its folder is made if missing), or ``None``: asked before
    a long computation, so a read-only or forbidden folder is said at once, not after the work."""
    folder = Path(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"{folder}: {e.strerror} ({_errno_name(e)})"
    problem = folder_write_problem(folder)
    return None if problem is None else f"cannot write {Path(path).name} there: {problem}"


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def png_bytes(image: np.ndarray, scale: int = 1) -> bytes:
    """(H, W, 3) uint8 as PNG bytes, optionally upscaled ``scale`` x with nearest neighbour (for tiny demo images)."""
    import io

    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def save_png(path: str | Path, image: np.ndarray, scale: int = 1) -> None:
    """Save (H, W, 3) uint8 as PNG (see :func:`png_bytes`), atomically."""
    atomic_write_bytes(path, png_bytes(image, scale))
