"""A SAKURA store: its layout (written once, here: the keys under a folder, or under an object store's prefix) and
the read side of a store folder. The server's ``LocalStore``
(``cloud_server.store``) adds the writes on top of :class:`StoreReader`; a local shard source
(:mod:`sakura_core.fetch.local_source`) reads a store through it directly, without a server.

Layout (the same keys work unchanged as object-store keys or CDN paths)::

    ROOT/shards/<aa>/<digest>                 immutable shard blob; <digest> = sha256 hex of the blob, <aa> its first 2
    ROOT/templates/<id>/manifest.json         the template's manifest (published last)
    ROOT/templates/<id>/source.<png|jpg|webp> the template image it was computed from

Names are validated before any path is built: template ids ``[a-z0-9-]{1,64}``, digests 64 lowercase hex
characters (``sakura_core.kv.names``). A name that fails raises ``InvalidNameError`` without touching the filesystem.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

from ..kv.names import TEMPLATE_ID_RE, is_digest, is_template_id
from ..limits import MAX_JSON_BYTES

__all__ = [
    "InvalidNameError",
    "MANIFEST_FILE",
    "NotFoundError",
    "SHARDS_DIR",
    "SOURCE_IMAGE_EXTS",
    "StoreError",
    "StoreFaultError",
    "StoreReader",
    "TEMPLATES_DIR",
    "shard_key",
    "template_key",
    "validate_digest",
    "validate_template_id",
]

SHARDS_DIR = "shards"
TEMPLATES_DIR = "templates"
MANIFEST_FILE = "manifest.json"
SOURCE_IMAGE_EXTS = ("png", "jpg", "webp")


class StoreError(Exception):
    """Base class of store errors."""


class InvalidNameError(StoreError, ValueError):
    """A template id or digest is malformed (this is what a path-traversal attempt looks like)."""


class NotFoundError(StoreError, LookupError):
    """No shard with this digest, or no published template with this id."""


class StoreFaultError(StoreError):
    """A file the store names cannot be read: a folder or a symbolic link in its place (links are never followed,
    so nothing outside the store is served), no permission, an I/O error. Not transient: retrying does not help; the
    message says which file and why (``sakura store verify`` lists them)."""


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_in_store(root: str, parts: tuple[str, ...], what: str, missing: str) -> tuple[io.FileIO, int]:
    """``open(root/parts..., "rb", buffering=0)`` that follows no symbolic link below ``root``: neither the file nor
    any folder on the way (each opened relative to the last with ``O_NOFOLLOW``), so nothing outside the store is
    read. ``NotFoundError`` (absent, message ``missing``) or :class:`StoreFaultError` saying why ``what`` cannot be
    read."""
    dir_fd, depth = -1, 0
    try:
        dir_fd = os.open(root, _DIR_FLAGS)  # the root itself was resolved when the store was opened
        for name in parts[:-1]:
            depth += 1
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = fd
        depth = len(parts)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except FileNotFoundError as e:
        raise NotFoundError(missing) from e
    except OSError as e:
        link = e.errno == errno.ELOOP or (
            e.errno == errno.ENOTDIR and os.path.islink(os.path.join(root, *parts[:depth]))
        )
        why: str | None
        if link and depth < len(parts):
            why = f"its folder {'/'.join(parts[:depth])} is a symbolic link (the store never follows one)"
        elif link:
            why = "it is a symbolic link (the store never follows one)"
        else:
            why = e.strerror
        raise StoreFaultError(f"{what} cannot be read from the store: {why}") from e
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreFaultError(f"{what} cannot be read from the store: it is not a regular file (a folder?)")
        return os.fdopen(fd, "rb", buffering=0), st.st_size
    except BaseException:
        os.close(fd)
        raise


def validate_template_id(template_id: object) -> str:
    """Return ``template_id`` if it matches ``[a-z0-9-]{1,64}``, else raise ``InvalidNameError``."""
    if not is_template_id(template_id):
        raise InvalidNameError(
            f"invalid template id {str(template_id)[:80]!r}: use 1-64 characters from a-z, 0-9 and '-'"
        )
    return template_id


def validate_digest(digest: object) -> str:
    """Return ``digest`` if it is 64 lowercase hex characters (sha256), else raise ``InvalidNameError``."""
    if not is_digest(digest):
        raise InvalidNameError(f"invalid shard digest {str(digest)[:80]!r}: expected 64 lowercase hex characters")
    return digest


def shard_key(digest: str) -> str:
    """A shard's key relative to the store root: ``shards/<aa>/<digest>`` (the digest validated first)."""
    digest = validate_digest(digest)
    return f"{SHARDS_DIR}/{digest[:2]}/{digest}"


def template_key(template_id: str, name: str) -> str:
    """A template file's key relative to the store root: ``templates/<id>/<name>`` (the id validated first)."""
    return f"{TEMPLATES_DIR}/{validate_template_id(template_id)}/{name}"


class StoreReader:
    """The read side of a store folder (see the module docstring for the layout); creates nothing.

    Args:
        root: the store folder (``shards/`` and ``templates/`` inside).
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.shards_dir = self.root / SHARDS_DIR
        self.templates_dir = self.root / TEMPLATES_DIR
        self._root_str = str(self.root)

    @classmethod
    def existing(cls, root: str | os.PathLike) -> StoreReader:
        """A reader of ``root``; ``ValueError`` if the folder is not a SAKURA store (says how to make one)."""
        path = Path(root).expanduser()
        if not (path / TEMPLATES_DIR).is_dir():
            raise ValueError(
                f"{path} is not a SAKURA store (no {TEMPLATES_DIR}/ folder); create one with "
                f"`sakura precompute --store {path} --image IMAGE --id ID`"
            )
        return cls(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    # ---- paths (only ever built from validated names) -----------------------------------------------------
    def shard_path(self, digest: str) -> Path:
        return self.root / shard_key(digest)

    def template_dir(self, template_id: str) -> Path:
        return self.templates_dir / validate_template_id(template_id)

    # ---- reads ----------------------------------------------------------------------------------------------
    def open_shard(self, digest: str) -> tuple[io.RawIOBase, int]:
        """Open a shard for reading: (unbuffered binary file, size in bytes); ``NotFoundError`` when absent. The
        caller closes it."""
        validate_digest(digest)
        # the hot path of every shard request: plain strings and an unbuffered file (sendfile reads the fd)
        parts = (SHARDS_DIR, digest[:2], digest)
        return _open_in_store(self._root_str, parts, f"shard {digest}", f"no shard {digest} in {self}")

    def get_manifest_bytes(self, template_id: str) -> bytes:
        """The manifest exactly as stored; ``NotFoundError`` when the template is not published."""
        parts = (TEMPLATES_DIR, validate_template_id(template_id), MANIFEST_FILE)
        what = f"manifest of template {template_id!r}"
        f, size = _open_in_store(self._root_str, parts, what, f"no published template {template_id!r} in {self}")
        with f:
            if size > MAX_JSON_BYTES:
                raise StoreFaultError(f"{what} is {size} bytes, over the limit of {MAX_JSON_BYTES}")
            try:
                return f.read()
            except OSError as e:  # e.g. EIO
                raise StoreFaultError(f"{what} cannot be read from the store: {e.strerror}") from e

    def list_templates(self) -> list[str]:
        """Ids of published templates (those with a manifest), sorted."""
        if self.templates_dir.is_symlink():  # a link out of the store is never followed (store verify says so)
            return []
        ids = []
        for entry in os.scandir(self.templates_dir):
            if TEMPLATE_ID_RE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                if os.path.isfile(os.path.join(entry.path, MANIFEST_FILE)):
                    ids.append(entry.name)
        return sorted(ids)

    def source_image_path(self, template_id: str) -> Path | None:
        """The template image a template was computed from, if the store keeps it."""
        folder = self.template_dir(template_id)
        for ext in SOURCE_IMAGE_EXTS:
            if (folder / f"source.{ext}").is_file():
                return folder / f"source.{ext}"
        return None
