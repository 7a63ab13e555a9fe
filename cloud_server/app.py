"""The SAKURA cloud server as an aiohttp application: ``create_app(config)``.

Read path (optionally behind a read token):

- ``GET /v1/templates``                  catalog of published templates for the served model; one page of it with
                                         ``?limit=N&after=ID`` (id order, ``next`` cursor: :mod:`.catalog_index`)
- ``GET /v1/templates/{id}/manifest``    a template's manifest (ETag, revalidated by caches: ``no-cache``)
- ``GET /v1/shards/{digest}``            an immutable shard: strong ETag = digest, single ``Range`` (206/416),
                                         ``If-None-Match`` (304), ``Cache-Control: public, max-age=31536000,
                                         immutable`` (``private`` behind a read token), sent with ``sendfile``
  (all three: ``If-Match`` compared strongly, 412; a wrong token 401, or 429 past ``max_token_failures``)
- ``GET /metrics``                       Prometheus text: requests, bytes, errors, in-flight, jobs
- ``GET /phone``                         the phone page's static files (open; :mod:`.phone_page`)

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
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sakura_core.http_serving import bearer_token, token_matches
from sakura_core.kv.manifest import ManifestError

from .catalog_index import CatalogBuildingError, parse_page_query
from .config import ServerConfig
from .cors import cors_middleware, cors_on_prepare
from .http_util import (
    _access,
    _ClientGone,
    _etag_matches,
    _json_error,
    _Unsatisfiable,
    check_if_match,
    parse_range,
)
from .phone_page import phone_routes
from .precompute import PrecomputeFn, load_model
from .shard_body import send_body
from .state import CONFIG_KEY, STATE_KEY, Metrics, ServerState
from .store import (
    InvalidNameError,
    LocalStore,
    NotFoundError,
    Store,
    StoreError,
    validate_digest,
    validate_template_id,
)
from .store_faults import NO_RETRY_HEADER, checked_manifest, fault_response
from .write_path import _MULTIPART_OVERHEAD_BYTES, handle_job, handle_upload

__all__ = ["CONFIG_KEY", "STATE_KEY", "Metrics", "ServerState", "create_app", "parse_range"]

logger = logging.getLogger(__name__)

SHARD_CACHE_CONTROL = "public, max-age=31536000, immutable"
JSON_CACHE_CONTROL = "public, no-cache"
# Behind a read token a shared cache must not answer other clients (RFC 9111 3.5: ``public`` would let it): the
# responses are ``private``. A CDN in front of a token-gated server needs its own recipe (docs/server.md).
PRIVATE_SHARD_CACHE_CONTROL = "private, max-age=31536000, immutable"
PRIVATE_JSON_CACHE_CONTROL = "private, no-cache"
_FORBIDDEN_IN_PATH = ("..", "%2e", "%2f", "%5c", "\\", "%00", "\x00")


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
            _check_token(request, state, cfg.write_token)
        elif access == "read" and cfg.read_token is not None:
            _check_token(request, state, cfg.read_token, cfg.write_token)
        resp = await handler(request)
        status = resp.status
        if isinstance(resp, web.Response) and isinstance(resp.body, (bytes, bytearray)) and request.method != "HEAD":
            m.bytes_sent += len(resp.body)
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    except StoreError as e:  # a store fault no handler answered (the catalog's): the same mapping
        answer = _store_failure(request, e)
        status = answer.status
        raise answer from e
    except _ClientGone as e:  # reset mid-body: quietly hand aiohttp the cut response (no 500, no traceback)
        status = 499  # nginx's "client closed request"
        m.aborted += 1
        logger.debug("%s %s: %s", request.method, request.path, e)
        return e.response
    except asyncio.CancelledError as e:  # a response cut by shutdown or a lost connection
        status = 499
        m.aborted += 1
        logger.debug("%s %s: cancelled: %r", request.method, request.path, e)
        raise
    except ConnectionError as e:
        if request.transport is not None and not request.transport.is_closing():
            logger.exception("%s %s failed", request.method, request.path)  # not the client's connection
            raise
        status = 499  # e.g. the client left while its upload was read
        m.aborted += 1
        logger.debug("%s %s: client went away: %r", request.method, request.path, e)
        return web.Response(status=499)
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


def _store_failure(request: web.Request, e: StoreError | ManifestError, context: str = "") -> web.HTTPException:
    """``store_faults.fault_response``: the one place a store fault becomes a response (and a log line)."""
    return fault_response(request.app[STATE_KEY].fault_log, e, f"{request.method} {request.path}", context)


def _check_token(request: web.Request, state: ServerState, *allowed: str | None) -> None:
    """Pass a right bearer token (never slowed); a wrong one is 401, or 429 with ``Retry-After`` once its address
    sent too many in a window (``TokenThrottle``)."""
    if token_matches(bearer_token(request.headers.get("Authorization")), *allowed):
        return
    retry_after_s = state.token_throttle.failed(request.remote)
    if retry_after_s is not None:
        raise _json_error(
            429,
            f"too many wrong bearer tokens from this address; retry in {retry_after_s:.0f} s with the right one",
            {"Retry-After": f"{retry_after_s:.0f}", NO_RETRY_HEADER: "no"},  # a client retrying the token is told
        )
    raise _json_error(401, "a valid bearer token is required", {"WWW-Authenticate": 'Bearer realm="sakura"'})


# ---- read handlers --------------------------------------------------------------------------------------------
@_access("open")
async def handle_healthz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    off = state.write_off_reason
    body = {"status": "ok", "model_id": state.model_id, "write": off is None}
    if off is not None:
        body["write_off"] = off
    return web.json_response(body)


@_access("read")
async def handle_metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.Response(text=state.metrics.render(state.job_counts()), content_type="text/plain", charset="utf-8")


def _json_response(request: web.Request, body: bytes, etag: str) -> web.Response:
    gated = request.app[STATE_KEY].config.read_token is not None
    headers = {"ETag": etag, "Cache-Control": PRIVATE_JSON_CACHE_CONTROL if gated else JSON_CACHE_CONTROL}
    check_if_match(request, etag)
    if _etag_matches(request.headers.get("If-None-Match"), etag):
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type="application/json", headers=headers)


@_access("read")
async def handle_catalog(request: web.Request) -> web.Response:
    """The whole catalog, or one page with ``?limit=N&after=ID`` (:mod:`.catalog_index`)."""
    try:
        page = parse_page_query(request.query)
    except ValueError as e:
        raise _json_error(400, str(e)) from e
    try:
        body, etag = await request.app[STATE_KEY].catalog(*(page or ()))
    except CatalogBuildingError as e:  # the first build of a large store: the client retries after Retry-After
        raise _json_error(503, str(e), {"Retry-After": str(e.retry_after_s)}) from e
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
        return raw, checked_manifest(raw, template_id).model_id  # a corrupt manifest is not served

    try:
        raw, model_id = await state.store_io.run(f"manifest:{template_id}", read)
    except NotFoundError as e:
        raise _json_error(404, f"no published template {template_id!r}") from e
    except (StoreError, ManifestError) as e:  # the store's fault: say which and whether retrying can help
        raise _store_failure(request, e, f"template {template_id!r}") from e
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
    try:
        if state.store.open_is_fast:  # a local disk: like nginx, open on the event loop (no thread hop)
            fobj, size = state.store.open_shard(digest)
        else:
            fobj, size = await state.store_io.run(digest, state.store.open_shard, digest)
    except NotFoundError as e:
        raise _json_error(404, f"no shard {digest}") from e
    except StoreError as e:
        raise _store_failure(request, e) from e
    try:
        etag = f'"{digest}"'
        headers = {
            "ETag": etag,
            "Cache-Control": SHARD_CACHE_CONTROL if state.config.read_token is None else PRIVATE_SHARD_CACHE_CONTROL,
            "Accept-Ranges": "bytes",
            # RFC 9530: the digest of the whole representation, so any hop can verify it.
            "Repr-Digest": f"sha-256=:{base64.b64encode(bytes.fromhex(digest)).decode()}:",
        }
        if _etag_matches(request.headers.get("If-None-Match"), etag):
            return web.Response(status=304, headers=headers)
        check_if_match(request, etag)
        rng = _range_of(request, etag, size)
        offset, count = rng if rng is not None else (0, size)
        resp = web.StreamResponse(status=206 if rng is not None else 200, headers=headers)
        resp.content_type = "application/octet-stream"
        resp.content_length = count
        if rng is not None:
            resp.headers["Content-Range"] = f"bytes {offset}-{offset + count - 1}/{size}"
        try:
            await resp.prepare(request)
            if request.method != "HEAD" and count:
                await send_body(request, resp, fobj, offset, count, state.config.send_chunk_bytes, state.store_io)
                state.metrics.bytes_sent += count
            await resp.write_eof()
        except ConnectionError as e:  # reset, broken pipe, or asyncio's "Connection closed by peer"
            if request.transport is not None:
                request.transport.close()  # the body is cut: this connection cannot carry another response
            raise _ClientGone(resp, e) from None
        except StoreError as e:  # the store failed mid-body (an S3 read timed out or was cut): cut the response
            _store_failure(request, e)  # logged as the store's fault; the client sees a short body and retries
            if request.transport is not None:
                request.transport.close()
            return resp
        return resp
    finally:
        fobj.close()


def _range_of(request: web.Request, etag: str, size: int) -> tuple[int, int] | None:
    """The one range to send (``None``: the whole shard), honouring ``If-Range``; 416 for a bad or duplicated one."""
    if_range = request.headers.get("If-Range")
    if if_range is not None and if_range.strip() != etag:
        return None
    ranges = request.headers.getall("Range", [])
    try:
        if len(ranges) > 1:  # not a list-valued field: combined, two fields make an invalid ranges-specifier
            raise _Unsatisfiable
        return parse_range(ranges[0] if ranges else None, size)
    except _Unsatisfiable:
        shown = ranges[0] if len(ranges) == 1 else f"{len(ranges)} Range header fields"
        shown = shown if len(shown) <= 40 else shown[:40] + "…"
        raise _json_error(
            416,
            f"Range {shown!r} not satisfiable: send one 'bytes=first-last' range within 0..{size - 1}",
            {"Content-Range": f"bytes */{size}", "Accept-Ranges": "bytes"},
        ) from None


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
    phone_routes(routes)
    return routes


def create_app(
    config: ServerConfig,
    *,
    store: Store | None = None,
    model: Any | None = None,
    precompute_fn: PrecomputeFn | None = None,
) -> web.Application:
    """Build the app. ``store`` defaults to the store ``config`` names (``LocalStore`` or ``S3Store``); ``model`` (anything with ``model_id``)
    defaults to loading ``config.model`` at startup; ``precompute_fn`` to ``sakura_core.precompute.precompute_template``.
    """
    app = web.Application(
        middlewares=[cors_middleware, _guard],
        client_max_size=config.max_upload_bytes + _MULTIPART_OVERHEAD_BYTES,
        handler_args={
            "max_line_size": config.max_header_bytes,
            "max_field_size": config.max_header_bytes,
            "max_headers": config.max_headers,
            "keepalive_timeout": config.idle_timeout_s,  # armed at connect: an idle or half-sent request is closed
        },
    )
    state = ServerState(config, store or config.open_store(), model, precompute_fn)
    app[CONFIG_KEY] = config
    app[STATE_KEY] = state
    app.add_routes(_routes())
    app.on_response_prepare.append(cors_on_prepare)
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application):
    """Startup: check the store (an object store: the bucket answers), sweep stale temp files, load the served
    model, start the precompute worker. Cleanup: stop it."""
    state = app[STATE_KEY]
    cfg = state.config
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, state.store.check)
    state.store_write_problem = await loop.run_in_executor(None, state.store.write_problem)
    if state.store_write_problem is not None:
        logger.warning("write path off: %s", state.store_write_problem)
    elif isinstance(state.store, LocalStore):
        await loop.run_in_executor(None, state.store.sweep_temp_files)
    model_name = cfg.model
    if state.model is None and model_name is not None:
        logger.info("loading model %r ...", model_name)
        state.model = await loop.run_in_executor(
            None, lambda: load_model(model_name, device=cfg.device, dtype=cfg.dtype)
        )
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
    state.store_io.shutdown()
