"""The SAKURA cloud server as an aiohttp application: ``create_app(config)``.

Read path (optionally behind a read token):

- ``GET /v1/templates``                  catalog of published templates for the served model
- ``GET /v1/templates/{id}/manifest``    a template's manifest (ETag, revalidated by caches: ``no-cache``)
- ``GET /v1/shards/{digest}``            an immutable shard: strong ETag = digest, single ``Range`` (206/416),
                                         ``If-None-Match`` (304), ``Cache-Control: public, max-age=31536000,
                                         immutable``, sent zero-copy with ``sendfile``
- ``GET /metrics``                       Prometheus text: requests, bytes, errors, in-flight, jobs

Write path (bearer write token): ``POST /v1/templates`` (a template image, multipart or raw, size-limited) starts a
precompute job in a worker thread and answers 202 with ``/v1/jobs/{job_id}`` (``GET`` it for progress); the
manifest is published last. ``GET /healthz`` is always open. No endpoint accepts user images or prompts: edits run
on the phone.

Shards are not sent with ``web.FileResponse``: it derives its ETag from mtime and size and evaluates
``If-None-Match``/``If-Range`` against that, while a shard's validator is its digest. The conditional and range
logic lives in ``handle_shard``; the body goes out with the same ``sendfile`` that ``FileResponse`` uses.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import hmac
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .config import ServerConfig
from .precompute import ImageError, PrecomputeFn, TemplateExistsError, decode_image, load_model, publish_template
from .store import InvalidNameError, LocalStore, NotFoundError, Store, validate_digest, validate_template_id

__all__ = ["CONFIG_KEY", "STATE_KEY", "Metrics", "ServerState", "bound_port", "create_app", "parse_range"]

logger = logging.getLogger(__name__)

SHARD_CACHE_CONTROL = "public, max-age=31536000, immutable"
JSON_CACHE_CONTROL = "public, no-cache"
_MULTIPART_OVERHEAD_BYTES = 64 * 2**10
_MAX_FORM_FIELD_BYTES = 1024
_MAX_JOBS_KEPT = 256
_RAW_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "application/octet-stream"})
_FORBIDDEN_IN_PATH = ("..", "%2e", "%2f", "%5c", "\\", "%00", "\x00")


# ---- state ----------------------------------------------------------------------------------------------------
@dataclass
class Metrics:
    """Counters behind ``GET /metrics``; ``bytes_sent`` counts response bodies (shards, manifests, catalogs)."""

    started_s: float = field(default_factory=time.monotonic)
    requests: dict[str, int] = field(default_factory=dict)
    responses: dict[str, int] = field(default_factory=dict)
    bytes_sent: int = 0
    errors: int = 0
    client_errors: int = 0
    aborted: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    def render(self, jobs: dict[str, int]) -> str:
        lines = [
            "# HELP sakura_requests_total Requests received, by route.",
            "# TYPE sakura_requests_total counter",
            *(f'sakura_requests_total{{route="{k}"}} {v}' for k, v in sorted(self.requests.items())),
            "# HELP sakura_responses_total Responses sent, by status class.",
            "# TYPE sakura_responses_total counter",
            *(f'sakura_responses_total{{code="{k}"}} {v}' for k, v in sorted(self.responses.items())),
            "# HELP sakura_bytes_sent_total Response body bytes sent.",
            "# TYPE sakura_bytes_sent_total counter",
            f"sakura_bytes_sent_total {self.bytes_sent}",
            "# HELP sakura_errors_total Server errors (5xx and unhandled exceptions).",
            "# TYPE sakura_errors_total counter",
            f"sakura_errors_total {self.errors}",
            "# HELP sakura_client_errors_total Requests refused with a 4xx status.",
            "# TYPE sakura_client_errors_total counter",
            f"sakura_client_errors_total {self.client_errors}",
            "# HELP sakura_aborted_total Responses cut short because the client went away.",
            "# TYPE sakura_aborted_total counter",
            f"sakura_aborted_total {self.aborted}",
            "# HELP sakura_in_flight Requests being handled now.",
            "# TYPE sakura_in_flight gauge",
            f"sakura_in_flight {self.in_flight}",
            "# HELP sakura_max_in_flight Most requests handled at once since start.",
            "# TYPE sakura_max_in_flight gauge",
            f"sakura_max_in_flight {self.max_in_flight}",
            "# HELP sakura_jobs Precompute jobs, by state.",
            "# TYPE sakura_jobs gauge",
            *(f'sakura_jobs{{state="{k}"}} {v}' for k, v in sorted(jobs.items())),
            "# HELP sakura_uptime_seconds Seconds since the app started.",
            "# TYPE sakura_uptime_seconds gauge",
            f"sakura_uptime_seconds {time.monotonic() - self.started_s:.3f}",
        ]
        return "\n".join(lines) + "\n"


@dataclass
class Job:
    """A precompute job; ``stage``/``done``/``total`` follow the codec's progress callback."""

    job_id: str
    template_id: str
    state: str = "queued"  # queued | running | done | failed
    stage: str = ""
    done: int = 0
    total: int = 0
    error: str | None = None
    shards: int = 0
    shard_bytes: int = 0
    created_s: float = field(default_factory=time.time)
    finished_s: float | None = None

    def to_json(self) -> dict:
        return {
            "job_id": self.job_id,
            "template_id": self.template_id,
            "state": self.state,
            "progress": {"stage": self.stage, "done": self.done, "total": self.total},
            "error": self.error,
            "shards": self.shards,
            "shard_bytes": self.shard_bytes,
            "manifest_url": f"/v1/templates/{self.template_id}/manifest" if self.state == "done" else None,
        }


class _Cancelled(Exception):
    """Raised inside a precompute job's progress callback when the server shuts down."""


class ServerState:
    """Everything one app instance owns (no module globals): store, model, jobs, metrics, caches."""

    def __init__(self, config: ServerConfig, store: Store, model: Any | None, precompute_fn: PrecomputeFn | None):
        self.config = config
        self.store = store
        self.model = model
        self.precompute_fn = precompute_fn
        self.metrics = Metrics()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.job_tasks: set[asyncio.Task] = set()
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.stopping = threading.Event()
        self._catalog: tuple[float, bytes, str] | None = None
        self._catalog_lock = asyncio.Lock()

    @property
    def model_id(self) -> str | None:
        return None if self.model is None else self.model.model_id

    def invalidate_catalog(self) -> None:
        self._catalog = None

    def job_counts(self) -> dict[str, int]:
        counts = {"queued": 0, "running": 0, "done": 0, "failed": 0}
        for job in self.jobs.values():
            counts[job.state] = counts.get(job.state, 0) + 1
        return counts

    async def catalog(self) -> tuple[bytes, str]:
        """(JSON body, ETag) of the catalog, rebuilt at most every ``catalog_ttl_s``."""
        now = time.monotonic()
        cached = self._catalog
        if cached is not None and now - cached[0] < self.config.catalog_ttl_s:
            return cached[1], cached[2]
        async with self._catalog_lock:
            cached = self._catalog
            if cached is not None and time.monotonic() - cached[0] < self.config.catalog_ttl_s:
                return cached[1], cached[2]
            body = await asyncio.get_running_loop().run_in_executor(None, self._build_catalog)
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            self._catalog = (time.monotonic(), body, etag)
            return body, etag

    def _build_catalog(self) -> bytes:
        entries, skipped = [], 0
        for template_id in self.store.list_templates():
            try:
                m = self.store.get_manifest(template_id)
            except (NotFoundError, ValueError) as e:
                logger.warning("catalog: template %s skipped: %s", template_id, e)
                continue
            if self.model_id is not None and m.get("model_id") != self.model_id:
                skipped += 1
                continue
            levels: dict[int, int] = {}
            for shard in m.get("shards", []):
                for rep in shard.get("representations", []):
                    levels[rep["level"]] = levels.get(rep["level"], 0) + rep["bytes"]
            entries.append(
                {
                    "id": template_id,
                    "model_id": m.get("model_id"),
                    "token_grid": m.get("token_grid"),
                    "codec": m.get("codec"),
                    "num_layers": m.get("num_layers"),
                    "shards": len(m.get("shards", [])),
                    "bytes_by_level": {str(k): v for k, v in sorted(levels.items())},
                    "manifest_url": f"/v1/templates/{template_id}/manifest",
                }
            )
        if skipped:
            logger.info("catalog: %d template(s) made for other models not listed", skipped)
        return json.dumps({"model_id": self.model_id, "templates": entries}).encode()


CONFIG_KEY = web.AppKey("config", ServerConfig)
STATE_KEY = web.AppKey("state", ServerState)


# ---- helpers --------------------------------------------------------------------------------------------------
def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.HTTPException:
    cls = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
        409: web.HTTPConflict,
        412: web.HTTPPreconditionFailed,
        413: web.HTTPRequestEntityTooLarge,
        415: web.HTTPUnsupportedMediaType,
        416: web.HTTPRequestRangeNotSatisfiable,
        429: web.HTTPTooManyRequests,
        503: web.HTTPServiceUnavailable,
    }[status]
    body = json.dumps({"error": message, "status": status})
    if cls is web.HTTPRequestEntityTooLarge:
        return cls(max_size=0, actual_size=0, text=body, content_type="application/json", headers=headers)
    return cls(text=body, content_type="application/json", headers=headers)


def _access(kind: str) -> Callable:
    """Mark a handler ``open`` (no token), ``read`` (read token when configured) or ``write`` (write token)."""

    def mark(handler: Callable) -> Callable:
        handler.sakura_access = kind
        handler.sakura_route = handler.__name__.removeprefix("handle_")
        return handler

    return mark


def _etag_matches(header: str | None, etag: str) -> bool:
    """Weak comparison of an ``If-None-Match``/``If-Match`` list against a quoted etag (``*`` matches)."""
    if header is None:
        return False
    for item in header.split(","):
        item = item.strip()
        if item == "*" or item.removeprefix("W/") == etag:
            return True
    return False


class _Unsatisfiable(Exception):
    pass


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """A ``Range`` header -> (offset, count), ``None`` to send everything; raise ``_Unsatisfiable`` (416).

    One ``bytes`` range only: ``a-b``, ``a-`` or ``-n``. Another unit is ignored (RFC 9110 14.2); several ranges or
    a malformed or unsatisfiable one are refused.
    """
    if value is None:
        return None
    unit, _, spec = value.strip().partition("=")
    if unit.strip().lower() != "bytes":
        return None
    spec = spec.strip()
    first, dash, last = spec.partition("-")
    if "," in spec or not dash or not (first.isdigit() or last.isdigit()):
        raise _Unsatisfiable
    if not first:  # suffix: the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise _Unsatisfiable
        start = max(0, size - n)
        return start, size - start
    if not first.isdigit() or (last and not last.isdigit()):
        raise _Unsatisfiable
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        raise _Unsatisfiable
    return start, end - start + 1


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _token_ok(given: str | None, *allowed: str | None) -> bool:
    if given is None:
        return False
    return any(t is not None and hmac.compare_digest(given.encode(), t.encode()) for t in allowed)


# ---- middleware -----------------------------------------------------------------------------------------------
@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Metrics, path-traversal refusal and token checks around every request."""
    state = request.app[STATE_KEY]
    m = state.metrics
    route_handler = request.match_info.route.handler
    route = getattr(route_handler, "sakura_route", "other")
    m.requests[route] = m.requests.get(route, 0) + 1
    m.in_flight += 1
    m.max_in_flight = max(m.max_in_flight, m.in_flight)
    status = 500
    try:
        raw_path = request.raw_path.partition("?")[0]
        if ("." in raw_path or "%" in raw_path or "\\" in raw_path or "\x00" in raw_path) and any(
            bad in raw_path.lower() for bad in _FORBIDDEN_IN_PATH
        ):
            raise _json_error(400, "invalid path: dot segments and encoded separators are not allowed")
        access = getattr(route_handler, "sakura_access", "read")
        cfg = state.config
        if access == "write":
            if cfg.write_token is None:
                raise _json_error(403, "the write path is disabled: start the server with --token or SAKURA_TOKEN")
            if not _token_ok(_bearer(request), cfg.write_token):
                raise _json_error(
                    401, "a valid bearer token is required", {"WWW-Authenticate": 'Bearer realm="sakura"'}
                )
        elif access == "read" and cfg.read_token is not None:
            if not _token_ok(_bearer(request), cfg.read_token, cfg.write_token):
                raise _json_error(
                    401, "a valid bearer token is required", {"WWW-Authenticate": 'Bearer realm="sakura"'}
                )
        resp = await handler(request)
        status = resp.status
        if isinstance(resp, web.Response) and resp.body is not None and request.method != "HEAD":
            m.bytes_sent += len(resp.body)
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    except (ConnectionResetError, BrokenPipeError, asyncio.CancelledError) as e:
        status = 499  # nginx's "client closed request"; also a response cut by shutdown
        m.aborted += 1
        logger.debug("%s %s: client went away: %r", request.method, request.path, e)
        raise
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        raise
    finally:
        m.in_flight -= 1
        if status != 499:
            key = f"{status // 100}xx"
            m.responses[key] = m.responses.get(key, 0) + 1
            if status >= 500:
                m.errors += 1
            elif status >= 400:
                m.client_errors += 1


# ---- read handlers --------------------------------------------------------------------------------------------
@_access("open")
async def handle_healthz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response({"status": "ok", "model_id": state.model_id, "write": state.config.write_enabled})


@_access("read")
async def handle_metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.Response(text=state.metrics.render(state.job_counts()), content_type="text/plain", charset="utf-8")


def _json_response(request: web.Request, body: bytes, etag: str) -> web.Response:
    headers = {"ETag": etag, "Cache-Control": JSON_CACHE_CONTROL}
    if _etag_matches(request.headers.get("If-None-Match"), etag):
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type="application/json", headers=headers)


@_access("read")
async def handle_catalog(request: web.Request) -> web.Response:
    body, etag = await request.app[STATE_KEY].catalog()
    return _json_response(request, body, etag)


@_access("read")
async def handle_manifest(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        template_id = validate_template_id(request.match_info["template_id"])
    except InvalidNameError as e:
        raise _json_error(400, str(e)) from e

    def read() -> tuple[bytes, str | None]:
        raw = state.store.get_manifest_bytes(template_id)
        try:
            model_id = json.loads(raw).get("model_id")
        except (ValueError, AttributeError):
            model_id = None
        return raw, model_id

    try:
        raw, model_id = await asyncio.get_running_loop().run_in_executor(None, read)
    except NotFoundError as e:
        raise _json_error(404, f"no published template {template_id!r}") from e
    if state.model_id is not None and model_id != state.model_id:
        raise _json_error(
            409,
            f"template {template_id!r} was computed for model {model_id}, but this server serves model "
            f"{state.model_id}; precompute it again for this model",
        )
    return _json_response(request, raw, '"' + hashlib.sha256(raw).hexdigest()[:32] + '"')


@_access("read")
async def handle_shard(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    try:
        digest = validate_digest(request.match_info["digest"])
    except InvalidNameError as e:
        raise _json_error(400, str(e)) from e
    loop = asyncio.get_running_loop()
    try:
        if state.store.open_is_fast:  # a local disk: like nginx, open on the event loop (no thread hop)
            fobj, size = state.store.open_shard(digest)
        else:
            fobj, size = await loop.run_in_executor(None, state.store.open_shard, digest)
    except NotFoundError as e:
        raise _json_error(404, f"no shard {digest}") from e
    try:
        etag = f'"{digest}"'
        headers = {
            "ETag": etag,
            "Cache-Control": SHARD_CACHE_CONTROL,
            "Accept-Ranges": "bytes",
            # RFC 9530: the digest of the whole representation, so any hop can verify it.
            "Repr-Digest": f"sha-256=:{base64.b64encode(bytes.fromhex(digest)).decode()}:",
        }
        if _etag_matches(request.headers.get("If-None-Match"), etag):
            return web.Response(status=304, headers=headers)
        if_match = request.headers.get("If-Match")
        if if_match is not None and not _etag_matches(if_match, etag):
            raise _json_error(412, f"If-Match {if_match!r} does not match {etag}")
        rng = None
        if_range = request.headers.get("If-Range")
        if if_range is None or if_range.strip() == etag:
            try:
                rng = parse_range(request.headers.get("Range"), size)
            except _Unsatisfiable:
                raise _json_error(
                    416,
                    f"Range {request.headers.get('Range')!r} not satisfiable: one range within 0..{size - 1}",
                    {"Content-Range": f"bytes */{size}", "Accept-Ranges": "bytes"},
                ) from None
        offset, count = rng if rng is not None else (0, size)
        resp = web.StreamResponse(status=206 if rng is not None else 200, headers=headers)
        resp.content_type = "application/octet-stream"
        resp.content_length = count
        if rng is not None:
            resp.headers["Content-Range"] = f"bytes {offset}-{offset + count - 1}/{size}"
        await resp.prepare(request)
        if request.method != "HEAD" and count:
            await _send_body(request, resp, fobj, offset, count, state.config.send_chunk_bytes)
            state.metrics.bytes_sent += count
        await resp.write_eof()
        return resp
    finally:
        fobj.close()


async def _send_body(
    request: web.Request, resp: web.StreamResponse, fobj, offset: int, count: int, chunk: int
) -> None:
    """Zero-copy ``sendfile`` when the shard is a real file, else a chunked copy (object stores).

    Fast path: with the transport's buffer empty (the headers went out), ``os.sendfile`` straight to the socket
    until the kernel would block; whatever is left goes through ``loop.sendfile``, which waits for writability.
    That is what ``loop.sendfile`` does itself, minus its per-call setup, which dominates for small shards.
    """
    loop = asyncio.get_running_loop()
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("connection lost before the body was sent")
    try:
        in_fd = fobj.fileno()
    except (AttributeError, OSError, ValueError):
        in_fd = None
    if in_fd is not None:
        sock = transport.get_extra_info("socket")
        plain = transport.get_extra_info("sslcontext") is None
        if sock is not None and plain and transport.get_write_buffer_size() == 0 and hasattr(os, "sendfile"):
            try:
                while count > 0:
                    sent = os.sendfile(sock.fileno(), in_fd, offset, count)
                    if sent == 0:
                        raise OSError(f"shard file ended {count} bytes early")
                    offset += sent
                    count -= sent
            except BlockingIOError:
                pass
            if count == 0:
                return
        try:
            await loop.sendfile(transport, fobj, offset, count)
            return
        except NotImplementedError:
            logger.info("sendfile unavailable on this transport; falling back to copying shard bodies")

    def read_at(pos: int, n: int) -> bytes:
        fobj.seek(pos)
        return fobj.read(n)

    pos, end = offset, offset + count
    while pos < end:
        data = await loop.run_in_executor(None, read_at, pos, min(chunk, end - pos))
        if not data:
            raise OSError(f"shard file ended at byte {pos} of {end}")
        await resp.write(data)
        pos += len(data)


# ---- write handlers -------------------------------------------------------------------------------------------
async def _read_limited(stream, limit: int, what: str) -> bytes:
    """Read a body part fully, refusing (413) once it passes ``limit`` bytes."""
    parts, n = [], 0
    while True:
        chunk = await stream.read_chunk(64 * 2**10) if hasattr(stream, "read_chunk") else await stream.read(2**16)
        if not chunk:
            break
        n += len(chunk)
        if n > limit:
            raise _json_error(413, f"{what} is over the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def _read_upload(request: web.Request, limit: int) -> tuple[str | None, bytes]:
    """(template id, image bytes) from a multipart form (fields ``id``, ``image``) or a raw image body (``?id=``)."""
    declared = request.content_length
    if declared is not None and declared > limit + _MULTIPART_OVERHEAD_BYTES:
        raise _json_error(413, f"upload of {declared} bytes is over the limit of {limit} bytes")
    ctype = request.content_type
    if ctype == "multipart/form-data":
        template_id, image = None, None
        reader = await request.multipart()
        async for part in reader:
            if part.name == "id" and template_id is None:
                raw = await _read_limited(part, _MAX_FORM_FIELD_BYTES, "field 'id'")
                template_id = raw.decode("utf-8", "replace").strip()
            elif part.name == "image" and image is None:
                image = await _read_limited(part, limit, "the image")
            else:  # unknown or repeated: refuse rather than read on
                raise _json_error(400, f"unexpected form field {str(part.name)[:40]!r}: send one 'id' and one 'image'")
        if image is None:
            raise _json_error(400, "the form has no 'image' file field")
        return template_id or request.query.get("id"), image
    if ctype in _RAW_IMAGE_TYPES:
        return request.query.get("id"), await _read_limited(request.content, limit, "the image")
    raise _json_error(
        415, f"Content-Type {ctype!r} not accepted: send multipart/form-data or a raw image/png|jpeg|webp body"
    )


@_access("write")
async def handle_upload(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    cfg = state.config
    if state.model is None:
        raise _json_error(409, "this server serves no model (--model none), so it cannot precompute templates")
    if state.stopping.is_set() or state.executor is None:
        raise _json_error(503, "the server is shutting down")
    template_id, data = await _read_upload(request, cfg.max_upload_bytes)
    try:
        template_id = validate_template_id(template_id)
    except InvalidNameError as e:
        raise _json_error(400, str(e)) from e
    active = [j for j in state.jobs.values() if j.state in ("queued", "running")]
    if any(j.template_id == template_id for j in active):
        raise _json_error(409, f"template {template_id!r} is already being precomputed")
    if len(active) >= cfg.max_pending_jobs:
        raise _json_error(429, f"{len(active)} precompute jobs are pending; retry later", {"Retry-After": "30"})
    loop = asyncio.get_running_loop()
    if await loop.run_in_executor(None, state.store.has_template, template_id):
        raise _json_error(409, f"template {template_id!r} is already published; pick another id")
    try:
        image, ext = await loop.run_in_executor(None, lambda: decode_image(data, max_pixels=cfg.max_image_pixels))
    except ImageError as e:
        raise _json_error(400, str(e)) from e
    job = Job(job_id=uuid.uuid4().hex, template_id=template_id)
    state.jobs[job.job_id] = job
    while len(state.jobs) > _MAX_JOBS_KEPT:
        oldest = next(iter(state.jobs.values()))
        if oldest.state in ("queued", "running"):
            break
        state.jobs.popitem(last=False)
    task = asyncio.create_task(_run_job(state, job, image, (data, ext)))
    state.job_tasks.add(task)
    task.add_done_callback(state.job_tasks.discard)
    url = f"/v1/jobs/{job.job_id}"
    body = {**job.to_json(), "status_url": url}
    return web.json_response(body, status=202, headers={"Location": url})


async def _run_job(state: ServerState, job: Job, image, source: tuple[bytes, str]) -> None:
    cfg = state.config

    def progress(stage: str, done: int, total: int) -> None:
        if state.stopping.is_set():
            raise _Cancelled("server shutting down")
        job.stage, job.done, job.total = stage, done, total

    def work():
        if state.stopping.is_set():
            raise _Cancelled("server shutting down")
        job.state = "running"
        return publish_template(
            state.store,
            state.model,
            image,
            job.template_id,
            codec=cfg.codec,
            shard_layers=cfg.shard_layers,
            seed=cfg.precompute_seed,
            source=source,
            progress=progress,
            precompute_fn=state.precompute_fn,
        )

    try:
        result = await asyncio.get_running_loop().run_in_executor(state.executor, work)
    except (_Cancelled, asyncio.CancelledError):
        job.state, job.error = "failed", "cancelled: the server shut down before the job finished"
        logger.warning("precompute job %s (%s) cancelled by shutdown", job.job_id, job.template_id)
    except TemplateExistsError as e:
        job.state, job.error = "failed", str(e)
    except Exception as e:
        job.state, job.error = "failed", f"{type(e).__name__}: {e}"
        logger.exception("precompute job %s (%s) failed", job.job_id, job.template_id)
    else:
        job.state, job.shards, job.shard_bytes = "done", result.shards, result.shard_bytes
        state.invalidate_catalog()
    finally:
        job.finished_s = time.time()


@_access("write")
async def handle_job(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    job_id = request.match_info["job_id"]
    job = state.jobs.get(job_id) if len(job_id) == 32 and all(c in "0123456789abcdef" for c in job_id) else None
    if job is None:
        raise _json_error(404, f"no job {job_id[:40]!r}")
    return web.json_response(job.to_json())


# ---- app ------------------------------------------------------------------------------------------------------
def _routes() -> web.RouteTableDef:
    routes = web.RouteTableDef()
    routes.get("/healthz")(handle_healthz)
    routes.get("/metrics")(handle_metrics)
    routes.get("/v1/templates")(handle_catalog)
    routes.post("/v1/templates")(handle_upload)
    routes.get("/v1/templates/{template_id}/manifest")(handle_manifest)
    routes.get("/v1/shards/{digest}")(handle_shard)
    routes.get("/v1/jobs/{job_id}")(handle_job)
    return routes


def create_app(
    config: ServerConfig,
    *,
    store: Store | None = None,
    model: Any | None = None,
    precompute_fn: PrecomputeFn | None = None,
) -> web.Application:
    """Build the app. ``store`` defaults to ``LocalStore(config.store_dir)``; ``model`` (anything with ``model_id``)
    defaults to loading ``config.model`` at startup; ``precompute_fn`` to ``sakura_core.kv.precompute_template``.
    """
    app = web.Application(
        middlewares=[_guard],
        client_max_size=config.max_upload_bytes + _MULTIPART_OVERHEAD_BYTES,
        handler_args={
            "max_line_size": config.max_header_bytes,
            "max_field_size": config.max_header_bytes,
            "max_headers": config.max_headers,
        },
    )
    state = ServerState(config, store or LocalStore(config.store_dir), model, precompute_fn)
    app[CONFIG_KEY] = config
    app[STATE_KEY] = state
    app.add_routes(_routes())
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application):
    """Startup: sweep stale temp files, load the served model, start the precompute worker. Cleanup: stop it."""
    state = app[STATE_KEY]
    cfg = state.config
    loop = asyncio.get_running_loop()
    if isinstance(state.store, LocalStore):
        await loop.run_in_executor(None, state.store.sweep_temp_files)
    if state.model is None and cfg.model is not None:
        logger.info("loading model %r ...", cfg.model)
        state.model = await loop.run_in_executor(None, load_model, cfg.model)
        logger.info("serving model %s (%s)", cfg.model, state.model_id)
    state.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sakura-precompute")
    yield
    state.stopping.set()
    if state.job_tasks:
        logger.info("waiting up to %.0f s for %d precompute job(s)", cfg.shutdown_timeout_s, len(state.job_tasks))
        _done, pending = await asyncio.wait(list(state.job_tasks), timeout=cfg.shutdown_timeout_s)
        for task in pending:
            task.cancel()
    state.executor.shutdown(wait=False, cancel_futures=True)
    state.executor = None


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port a started runner listens on (useful with port 0)."""
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError(f"runner has no TCP address: {runner.addresses}")
