"""The cloud server's write path: the authenticated template upload that starts a precompute job, and the job status.

The manifest is published last; no route here (or anywhere) takes a user image or prompt for an edit."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import aiohttp
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import BadHttpMessage

from .http_util import _access, _json_error
from .precompute import ImageError, TemplateExistsError, decode_image, publish_template
from .state import STATE_KEY, Job, ServerState, _Cancelled
from .store import InvalidNameError, validate_template_id
from .store_faults import NO_RETRY_HEADER

__all__ = ["handle_job", "handle_upload"]

logger = logging.getLogger(__name__)

_MULTIPART_OVERHEAD_BYTES = 64 * 2**10
_MAX_FORM_FIELD_BYTES = 1024
_MAX_JOBS_KEPT = 256
_RAW_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "application/octet-stream"})


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
        try:
            template_id, image = await _read_form(request, limit)
        except (ValueError, LookupError, AssertionError, aiohttp.ClientPayloadError, BadHttpMessage) as e:
            # aiohttp's multipart reader signals a malformed or truncated body with these (a 400, not a 500)
            raise _json_error(400, f"malformed multipart body: {type(e).__name__}: {str(e)[:120]}") from None
        if image is None:
            raise _json_error(400, "the form has no 'image' file field")
        return template_id or request.query.get("id"), image
    if ctype in _RAW_IMAGE_TYPES:
        return request.query.get("id"), await _read_limited(request.content, limit, "the image")
    raise _json_error(
        415, f"Content-Type {ctype!r} not accepted: send multipart/form-data or a raw image/png|jpeg|webp body"
    )


async def _read_form(request: web.Request, limit: int) -> tuple[str | None, bytes | None]:
    """The ``id`` and ``image`` fields of a multipart form; anything else is refused (400)."""
    template_id, image = None, None
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise _json_error(400, "nested multipart bodies are not accepted: send one 'id' and one 'image' field")
        if part.name == "id" and template_id is None:
            raw = await _read_limited(part, _MAX_FORM_FIELD_BYTES, "field 'id'")
            template_id = raw.decode("utf-8", "replace").strip()
        elif part.name == "image" and image is None:
            image = await _read_limited(part, limit, "the image")
        else:  # unknown or repeated: refuse rather than read on
            raise _json_error(400, f"unexpected form field {str(part.name)[:40]!r}: send one 'id' and one 'image'")
    return template_id, image


def _admit(state: ServerState, template_id: str | None) -> None:
    """409 when ``template_id`` is being precomputed, 429 when ``max_pending_jobs`` are; synchronous, so a caller
    that reserves its slot right after (no ``await`` in between) cannot race another upload."""
    active = [j for j in state.jobs.values() if j.state in ("queued", "running")]
    if template_id is not None and any(j.template_id == template_id for j in active):
        raise _json_error(409, f"template {template_id!r} is already being precomputed")
    if len(active) >= state.config.max_pending_jobs:
        raise _json_error(429, f"{len(active)} precompute jobs are pending; retry later", {"Retry-After": "30"})


@_access("write")
async def handle_upload(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    cfg = state.config
    if state.model is None:
        raise _json_error(409, "this server serves no model (--model none), so it cannot precompute templates")
    if state.stopping.is_set() or state.executor is None:
        raise _json_error(503, "the server is shutting down")
    if state.store_write_problem is not None:  # nothing read, nothing written: the store cannot keep a template
        raise _json_error(
            503,
            f"{state.store_write_problem}; make the store writable and restart the server",
            {NO_RETRY_HEADER: "no"},
        )
    _admit(state, None)  # a full server refuses before reading a body
    template_id, data = await _read_upload(request, cfg.max_upload_bytes)
    try:
        template_id = validate_template_id(template_id)
    except InvalidNameError as e:
        raise _json_error(400, str(e)) from e
    _admit(state, template_id)
    job = Job(job_id=uuid.uuid4().hex, template_id=template_id)
    state.jobs[job.job_id] = job  # reserves the slot and the id before the first await below
    try:
        image, ext = await _check_new_template(state, template_id, data)
    except BaseException:
        state.jobs.pop(job.job_id, None)
        raise
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


async def _check_new_template(state: ServerState, template_id: str, data: bytes):
    """409 when ``template_id`` is published, 400 when ``data`` is no acceptable image; the decoded image."""
    loop = asyncio.get_running_loop()
    if await loop.run_in_executor(None, state.store.has_template, template_id):
        raise _json_error(409, f"template {template_id!r} is already published; pick another id")
    try:
        return await loop.run_in_executor(None, lambda: decode_image(data, max_pixels=state.config.max_image_pixels))
    except ImageError as e:
        raise _json_error(400, str(e)) from e


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
            store_profile=cfg.store_profile,
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
