"""The phone page's large static files (onnxruntime-web's WASM, ~15 MB) sent gzip-compressed and revalidated.

:class:`CompressedFiles` compresses a file once (gzip, level 9, off the event loop) and keeps the result in memory
keyed by its path, size and mtime, so a changed file (a new ``npm ci``) is compressed again; each file has a strong
ETag of its uncompressed bytes (the same for either encoding). One instance per server (``ServerState``): no module
globals."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CompressedFile", "CompressedFiles"]

GZIP_LEVEL = 9  # the best ratio: compressed once per file, sent many times


@dataclass(frozen=True)
class CompressedFile:
    """One file as sent: ``raw`` bytes, their ``gzip`` form and the ETag (quoted SHA-256 prefix of ``raw``)."""

    raw: bytes
    gzip: bytes
    etag: str


class CompressedFiles:
    """Path -> :class:`CompressedFile`, compressed on first use and again when the file changes."""

    def __init__(self) -> None:
        self._files: dict[Path, tuple[tuple[int, int], CompressedFile]] = {}
        self._lock = asyncio.Lock()

    def reset(self) -> None:
        self._files.clear()

    async def get(self, path: Path) -> CompressedFile:
        """``path`` read and compressed (cached while its size and mtime stay the same)."""
        stat = path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        async with self._lock:  # one compression per file, however many pages load it at once
            held = self._files.get(path)
            if held is not None and held[0] == key:
                return held[1]
            made = await asyncio.to_thread(_compress, path)
            self._files[path] = (key, made)
            return made


def _compress(path: Path) -> CompressedFile:
    raw = path.read_bytes()
    etag = '"' + hashlib.sha256(raw).hexdigest()[:32] + '"'
    return CompressedFile(raw, gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0), etag)
