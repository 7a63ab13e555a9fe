"""The job body the host POSTs to the phone agent: a JSON header plus zstd-compressed tensor parts. No pickle.

Layout (all integers little-endian)::

    preamble  struct "<4sHHI": magic b"SKPJ", version, flags (0), header_bytes
    header    header_bytes of UTF-8 JSON: {"job": {...}, "parts": [{"name", "dtype", "shape", "raw_bytes",
              "zstd_bytes", "sha256"}, ...]}
    payloads  the parts' zstd frames, concatenated in header order

``sha256`` is the hex digest of a part's raw (decompressed, C-order) tensor bytes; it is checked after
decompression. Every length is checked against the body and against limits *before* anything is allocated or
decompressed: a part's ``raw_bytes`` must equal ``prod(shape) * itemsize`` and is the most zstd may produce; a
receiver that knows what it expects (the agent: one ``image`` of (side, side, 3) uint8) passes ``expect`` and
anything else is refused before a byte is decompressed. Parts are stream-decompressed into a buffer of exactly
``raw_bytes``, whatever size the zstd frame itself declares.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
import zstandard

__all__ = [
    "edit_request_from_header",
    "CONTENT_TYPE",
    "MAGIC",
    "VERSION",
    "WireError",
    "WireLimits",
    "decode_job_body",
    "encode_job_body",
]

MAGIC = b"SKPJ"
VERSION = 1
CONTENT_TYPE = "application/x-sakura-job"
_PREAMBLE = struct.Struct("<4sHHI")  # magic, version, flags, header_bytes
_DTYPES = {"uint8": np.uint8, "float16": np.float16, "float32": np.float32, "int32": np.int32, "int64": np.int64}
_MAX_NDIM = 4


class WireError(ValueError):
    """A job body is malformed, truncated, of another version, over a limit, or fails its sha256 check."""


@dataclass(frozen=True)
class WireLimits:
    """Limits a decoder enforces before allocating.

    Attributes:
        max_header_bytes: longest JSON header (bytes).
        max_parts: most tensor parts.
        max_part_bytes: largest raw (decompressed) tensor part (bytes).
        max_total_raw_bytes: sum of all raw parts (bytes).
    """

    max_header_bytes: int = 64 * 2**10
    max_parts: int = 8
    max_part_bytes: int = 64 * 2**20
    max_total_raw_bytes: int = 128 * 2**20

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_parts", "max_part_bytes", "max_total_raw_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"WireLimits.{name} must be >= 1, got {getattr(self, name)}")


def encode_job_body(job: dict, parts: dict[str, np.ndarray], *, level: int = 3) -> bytes:
    """``job`` (JSON-serialisable) and named tensors -> one body. Tensors are sent C-contiguous, little-endian."""
    if not isinstance(job, dict):
        raise TypeError(f"job must be a dict, got {type(job).__name__}")
    cctx = zstandard.ZstdCompressor(level=level)
    metas, payloads = [], []
    for name, array in parts.items():
        arr = np.ascontiguousarray(array)
        dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        arr = arr.astype(dtype, copy=False)
        if dtype.name not in _DTYPES:
            raise WireError(f"part {name!r}: dtype {dtype.name} not allowed; use one of {', '.join(_DTYPES)}")
        if arr.ndim > _MAX_NDIM:
            raise WireError(f"part {name!r}: {arr.ndim} dimensions, at most {_MAX_NDIM}")
        raw = arr.tobytes()
        frame = cctx.compress(raw)
        metas.append(
            {
                "name": name,
                "dtype": dtype.name,
                "shape": list(arr.shape),
                "raw_bytes": len(raw),
                "zstd_bytes": len(frame),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
        payloads.append(frame)
    header = json.dumps({"job": job, "parts": metas}, separators=(",", ":")).encode()
    return _PREAMBLE.pack(MAGIC, VERSION, 0, len(header)) + header + b"".join(payloads)


def _int(meta: dict, key: str, name: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WireError(f"part {name!r}: {key} must be a non-negative integer, got {value!r}")
    return value


def _shape_text(dtype_name: str, shape) -> str:
    return f"({', '.join(str(int(d)) for d in shape)}{',' if len(shape) == 1 else ''}) {dtype_name}"


def _check_expected(name: str, dtype_name: str, shape: list, expect: dict | None) -> None:
    if expect is None:
        return
    if name not in expect:
        raise WireError(f"unexpected part {name!r}: this receiver takes {', '.join(map(repr, expect)) or 'none'}")
    want_dtype, want_shape = expect[name]
    if dtype_name != want_dtype or tuple(shape) != tuple(want_shape):
        raise WireError(
            f"part {name!r} must be {_shape_text(want_dtype, want_shape)}, got {_shape_text(dtype_name, shape)}"
        )


def _decompress_part(dctx, frame: memoryview, name: str, raw_bytes: int, digest: str) -> bytearray:
    """Stream-decompress one frame into a buffer of exactly ``raw_bytes``; check the size and the sha256.

    The buffer is dropped before any error is raised, so no traceback keeps it alive."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise WireError(f"part {name!r}: corrupt zstd frame header: {e}") from None
    if declared not in (-1, raw_bytes):  # -1: the frame does not say
        raise WireError(f"part {name!r}: the zstd frame declares {declared} bytes, the header says {raw_bytes}")
    buf, hasher, pos, problem = bytearray(raw_bytes), hashlib.sha256(), 0, None
    try:
        with dctx.stream_reader(frame, read_across_frames=False) as reader:
            view = memoryview(buf)
            while pos < raw_bytes:
                n = reader.readinto(view[pos : pos + min(1 << 20, raw_bytes - pos)])
                if n == 0:
                    break
                hasher.update(view[pos : pos + n])
                pos += n
            view.release()
            extra = reader.read(1)
        if pos != raw_bytes or extra:
            problem = f"decompressed to {'more than ' if extra else ''}{pos} bytes, the header says {raw_bytes}"
        elif hasher.hexdigest() != digest:
            problem = f"sha256 mismatch (got {hasher.hexdigest()[:16]}…, header {digest[:16]}…)"
    except zstandard.ZstdError as e:
        problem = f"corrupt zstd frame: {e}"
    if problem is not None:
        del buf  # free it now, not when a traceback goes
        raise WireError(f"part {name!r}: {problem}")
    return buf


def decode_job_body(
    body: bytes, limits: WireLimits | None = None, expect: dict[str, tuple[str, tuple[int, ...]]] | None = None
) -> tuple[dict, dict[str, np.ndarray]]:
    """One body -> (job dict, {name: array}); raises :class:`WireError` naming the problem.

    ``expect`` (name -> (dtype name, shape)): the only parts accepted, each with exactly that dtype and shape,
    checked before anything is decompressed.
    """
    lim = limits or WireLimits()
    view = memoryview(body)
    header, end = _read_header(view, lim)
    metas = header.get("parts")
    if not isinstance(metas, list) or len(metas) > lim.max_parts:
        raise WireError(f"header 'parts' must be a list of at most {lim.max_parts} parts")
    # check every length first, so nothing is decompressed from a body that cannot be right
    plan, offset, total_raw = [], end, 0
    for i, meta in enumerate(metas):
        part = _plan_part(i, meta, offset, total_raw, view, lim, expect)
        total_raw += part[3]
        plan.append(part)
        offset += part[6]
    if offset != len(view):
        raise WireError(f"{len(view) - offset} trailing bytes after the last part")
    names = [p[0] for p in plan]
    if len(set(names)) != len(names):
        raise WireError(f"duplicate part names in {names}")
    return header["job"], _decode_parts(view, plan)


def _read_header(view: memoryview, lim: WireLimits) -> tuple[dict, int]:
    """The preamble checked and the JSON header parsed: (header, offset of the first part)."""
    if len(view) < _PREAMBLE.size:
        raise WireError(f"body is {len(view)} bytes, shorter than the {_PREAMBLE.size}-byte preamble")
    magic, version, flags, header_bytes = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}: not a SAKURA job body (expected {MAGIC!r})")
    if version != VERSION:
        raise WireError(f"job body version {version} is not supported by this agent (it reads version {VERSION})")
    if flags != 0:
        raise WireError(f"unknown flags 0x{flags:04x} in the job body")
    if header_bytes > lim.max_header_bytes:
        raise WireError(f"header of {header_bytes} bytes is over the limit of {lim.max_header_bytes}")
    end = _PREAMBLE.size + header_bytes
    if end > len(view):
        raise WireError(f"body truncated: the header needs {header_bytes} bytes, {len(view) - _PREAMBLE.size} left")
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"header is not UTF-8 JSON: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("job"), dict):
        raise WireError("header must be a JSON object with a 'job' object")
    return header, end


def _plan_part(i: int, meta, offset: int, total_raw: int, view: memoryview, lim: WireLimits, expect) -> tuple:
    """``parts[i]`` (at ``offset``, after ``total_raw`` raw bytes of parts) checked against the limits, ``expect``
    and the body's length, before any decompression: (name, dtype name, shape, raw bytes, sha256, offset, zstd
    bytes)."""
    if not isinstance(meta, dict):
        raise WireError(f"parts[{i}] must be an object")
    name = meta.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise WireError(f"parts[{i}].name must be a non-empty string of at most 64 characters")
    dtype_name = meta.get("dtype")
    if dtype_name not in _DTYPES:
        raise WireError(f"part {name!r}: dtype {dtype_name!r} not allowed; use one of {', '.join(_DTYPES)}")
    shape = meta.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape)
    ):
        raise WireError(f"part {name!r}: shape must be a list of at most {_MAX_NDIM} non-negative ints")
    _check_expected(name, dtype_name, shape, expect)
    raw_bytes, zstd_bytes = _int(meta, "raw_bytes", name), _int(meta, "zstd_bytes", name)
    itemsize = np.dtype(_DTYPES[dtype_name]).itemsize
    if raw_bytes != math.prod(shape) * itemsize:
        raise WireError(f"part {name!r}: raw_bytes {raw_bytes} != prod({shape}) * {itemsize}")
    if raw_bytes > lim.max_part_bytes:
        raise WireError(f"part {name!r}: {raw_bytes} bytes is over the limit of {lim.max_part_bytes}")
    if total_raw + raw_bytes > lim.max_total_raw_bytes:
        raise WireError(f"parts total over the limit of {lim.max_total_raw_bytes} bytes")
    digest = meta.get("sha256")
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise WireError(f"part {name!r}: sha256 must be 64 lowercase hex digits")
    if offset + zstd_bytes > len(view):
        raise WireError(f"body truncated: part {name!r} needs {zstd_bytes} bytes, {len(view) - offset} left")
    return name, dtype_name, shape, raw_bytes, digest, offset, zstd_bytes


def _decode_parts(view: memoryview, plan: list[tuple]) -> dict[str, np.ndarray]:
    """Every planned part decompressed and digest-checked; none kept when one fails."""
    dctx = zstandard.ZstdDecompressor()
    parts: dict[str, np.ndarray] = {}
    raw = None
    try:
        for name, dtype_name, shape, raw_bytes, digest, start, size in plan:
            raw = _decompress_part(dctx, view[start : start + size], name, raw_bytes, digest)
            parts[name] = np.frombuffer(raw, dtype=np.dtype(_DTYPES[dtype_name]).newbyteorder("<")).reshape(shape)
    except WireError:
        parts.clear()  # the parts decoded so far go now, not with the traceback
        raw = None  # noqa: F841
        raise
    return parts


_MAX_STEPS = 1000


_URL_PATH = re.compile(r"(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?")


def _cloud_url(url) -> str:
    """A SAKURA server's base URL: http(s), a host, at most a plain path prefix (a CDN mount point); no query,
    fragment, credentials, percent-escapes or dot segments, so the phone only ever asks for ``<url>/v1/...``."""
    try:
        parts = urlsplit(url) if isinstance(url, str) and len(url) <= 2048 else None
        port_ok = parts is not None and (parts.port is None or parts.port > 0)
    except ValueError:  # a port that is not a number
        parts, port_ok = None, False
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(f"cloud_url must be an http(s) URL of a SAKURA server, got {str(url)[:100]!r}")
    if parts.query or parts.fragment or parts.username or parts.password or "?" in url or "#" in url:
        raise ValueError(
            f"cloud_url must be a server's base URL without query, fragment or credentials, got {str(url)[:100]!r}"
        )
    if not _URL_PATH.fullmatch(parts.path):
        raise ValueError(
            f"cloud_url path {parts.path[:60]!r} must be empty or a plain prefix like /sakura (letters, "
            f"digits, '._~-' segments)"
        )
    return url


def edit_request_from_header(job: dict):
    """The job header (decoded JSON) as a validated ``sakura_core.edit.EditRequest``; ``ValueError`` names the bad
    field."""
    from sakura_core.edit import EditRequest, EditSettings, FetchSettings, ServerSource
    from sakura_core.fetch.link import LinkSpec
    from sakura_core.kv.names import TEMPLATE_ID_FORM, is_template_id

    required = ("template_id", "cloud_url", "prompt")
    missing = [k for k in required if k not in job]
    if missing:
        raise ValueError(f"job header lacks {', '.join(missing)}")
    template_id = job["template_id"]
    if not is_template_id(template_id):
        raise ValueError(f"template_id must match {TEMPLATE_ID_FORM}, got {str(template_id)[:80]!r}")
    url = _cloud_url(job["cloud_url"])
    bandwidth = job.get("bandwidth")
    if isinstance(bandwidth, str) and bandwidth.strip().startswith("trace:"):  # checked before a file is touched
        raise ValueError("bandwidth 'trace:<path>' reads a file on the phone; send 'live' or 'fixed:<Mbit/s>'")
    # the edit's one settings object: prompt, steps, seed, policy, link and latency target checked there, once
    fetch = FetchSettings(policy=job.get("policy", "sakura"), link=LinkSpec.parse(bandwidth))
    settings = EditSettings(job["prompt"], job.get("steps", 8), job.get("seed", 0), fetch)
    if settings.steps > _MAX_STEPS:
        raise ValueError(f"steps must be in 1..{_MAX_STEPS}, got {settings.steps}")
    token = job.get("cloud_token")
    source = ServerSource(url.rstrip("/"), token if isinstance(token, str) and token else None)
    return EditRequest(source, template_id, settings)
