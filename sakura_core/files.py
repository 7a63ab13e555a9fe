"""Files written whole or not at all (temp file + fsync + rename), and PNG output: shared by the CLIs, the store, the
servers and the benchmarks."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_json", "png_bytes", "save_png"]


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder + fsync + rename.

    A crash at any point leaves either the old file or the new one, never a partial file under ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def png_bytes(image: np.ndarray, scale: int = 1) -> bytes:
    """(H, W, 3) uint8 as PNG bytes, optionally upscaled ``scale`` x with nearest neighbour (for tiny demo images)."""
    import io

    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def save_png(path: str | Path, image: np.ndarray, scale: int = 1) -> None:
    """Save (H, W, 3) uint8 as PNG (see :func:`png_bytes`), atomically."""
    atomic_write_bytes(path, png_bytes(image, scale))
