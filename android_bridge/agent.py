"""The phone agent: an aiohttp app that runs private edits on the phone (or on an emulated phone, here).

Routes (every ``/v1`` route needs ``Authorization: Bearer <pairing token>``; 401 otherwise, 429 past 20 wrong ones
a minute from one address)::

    GET    /healthz                   liveness, no token, no information
    GET    /v1/info                   device profile, model id, memory budget, queue
    POST   /v1/jobs                   a job body (android_bridge.wire: JSON header + zstd tensor parts, sha256 each)
                                      -> 202 {job_id}; 4xx/5xx {"error", "code"}: codes in docs/phone.md
                                      ("Phone agent error codes"), e.g. 502 bad_manifest / cloud_unreachable
    GET    /v1/jobs/{id}              job status (JSON); with a WebSocket upgrade: progress events
    GET    /v1/jobs/{id}/result       multipart/mixed: the JSON report, then the edited image as PNG
    DELETE /v1/jobs/{id}              cancel a queued or running job (between layers); forget a finished one

WebSocket events (JSON): ``{"type": "state", "state": "queued"|"running"}``, ``{"type": "progress", "step",
"layer", "steps", "layers", "done", "total"}``, then exactly one of ``{"type": "done", "result_url"}``,
``{"type": "error", "code", "error"}``, ``{"type": "cancelled", "reason"}``. A client may send ``{"type":
"cancel"}``. Events so far are replayed to a late subscriber (progress coalesced to the latest).

A job takes its queue place before any network work, then its cloud host is checked and the manifest fetched
(``android_bridge.agent_admission``, ``android_bridge.cloud_host``; no redirect is followed). The phone fetches the
template's manifest, image and KV shards itself (``sakura_core.edit.edit_from_server``, the
core edit the sampler node runs); image and prompt arrive here only. One job runs; ``queue_size`` more may wait.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import numpy as np
from aiohttp import WSMsgType, web

from sakura_core.http_serving import bearer_token, token_matches

from .agent_admission import admit, admit_template, reserve
from .agent_admission import http_error as _error
from .agent_state import AGENT_STATE_KEY, AgentConfig, AgentState, EditFn, Job, _cancel, compute_description
from .agent_worker import _worker, measure_here, open_qnn
from .budget import DiTGeometry, OverBudgetError, check_budget
from .wire import CONTENT_TYPE, WireError, WireLimits, decode_job_body, edit_request_from_header

__all__ = ["AGENT_STATE_KEY", "AgentConfig", "AgentState", "Job", "compute_description", "create_app"]

logger = logging.getLogger(__name__)


PROTOCOL_VERSION = 1


# ---- helpers --------------------------------------------------------------------------------------------------
def _job(request: web.Request) -> Job:
    state = request.app[AGENT_STATE_KEY]
    job_id = request.match_info["job_id"]
    job = state.jobs.get(job_id) if len(job_id) == 32 and all(c in "0123456789abcdef" for c in job_id) else None
    if job is None:
        raise _error(
            404,
            f"no job {job_id[:40]!r} (finished jobs are kept for the last {state.config.jobs_kept})",
            "no_such_job",
        )
    return job


@web.middleware
async def _auth(request: web.Request, handler):
    if request.path.startswith("/v1/"):
        state = request.app[AGENT_STATE_KEY]
        if not token_matches(bearer_token(request.headers.get("Authorization")), state.config.token):
            retry_s = state.token_throttle.failed(request.remote)  # a right token is never limited
            if retry_s is not None:
                raise _error(
                    429,
                    "too many wrong pairing tokens from this address; retry later with the right one",
                    "rate_limited",
                    {"Retry-After": f"{retry_s:.0f}"},
                )
            raise _error(
                401,
                "a valid pairing token is required (Authorization: Bearer <token>)",
                "unauthorized",
                {"WWW-Authenticate": 'Bearer realm="sakura-phone"'},
            )
    return await handler(request)


# ---- handlers -------------------------------------------------------------------------------------------------
async def handle_healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def handle_info(request: web.Request) -> web.Response:
    state = request.app[AGENT_STATE_KEY]
    p, spec = state.profile, state.model.spec
    mem = _job_memory(state)
    return web.json_response(
        {
            "agent": "sakura-phone-agent",
            "protocol": PROTOCOL_VERSION,
            "wire": {"content_type": CONTENT_TYPE, "version": 1},
            "emulated": True,
            "profile": {
                "name": p.name,
                "soc": p.soc,
                "npu_session_bytes": p.npu_session_bytes,
                "host_budget_bytes": p.host_budget_bytes,
                "memory_budget_bytes": state.config.memory_budget_bytes or p.memory_budget_bytes,
                "step_cached_s": p.step_cached_s,
                "fixed_s": p.fixed_s,
                "link_mbit_s": p.link_mbit_s,
            },
            "model": {
                "id": state.model_id,
                "name": spec.name,
                "image_size": spec.image_size,
                "text_tokens": spec.text_tokens,
                "layers": state.model.adapter.num_layers,
                "weights": state.model.weights_source,
            },
            "compute": {
                "where": "this host's CPU (emulated phone)",
                **compute_description(state),
                "layer_full_s": state.live_profile.layer_full_s,
                "layer_cached_s": state.live_profile.layer_cached_s,
            },
            "job_memory": mem,
            "queue": {
                "size": state.config.queue_size,
                "waiting": len(state.queued()),
                "running": state.running.job_id if state.running else None,
            },
        }
    )


def _geometry(state: AgentState) -> DiTGeometry:
    """The model's geometry (set when the app starts)."""
    if state.geometry is None:
        raise RuntimeError("the phone agent has not started: its model's geometry is set by the app's start-up")
    return state.geometry


def _job_memory(state: AgentState) -> dict:
    try:
        return check_budget(_geometry(state), state.profile, state.config.memory_budget_bytes).to_json()
    except OverBudgetError as e:
        return e.memory.to_json()


async def handle_submit(request: web.Request) -> web.Response:
    state = request.app[AGENT_STATE_KEY]
    cfg = state.config
    if request.content_type != CONTENT_TYPE:
        raise _error(
            415,
            f"send the job as {CONTENT_TYPE} (android_bridge.wire), not {request.content_type!r}",
            "unsupported_media_type",
        )
    if request.content_length is not None and request.content_length > cfg.max_body_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=cfg.max_body_bytes, actual_size=request.content_length)
    if state.queue is None:
        raise _error(503, "the agent is starting or stopping", "unavailable")
    admit(state)  # a full queue answers before the body is read
    header, parts = await _decode_body(state, request)
    try:
        req = edit_request_from_header(header)
    except (ValueError, TypeError) as e:
        raise _error(400, f"bad job header: {e}", "bad_job") from e
    s = state.model.spec.image_size
    image = parts.get("image")
    if image is None or image.dtype != np.uint8 or image.shape != (s, s, 3):
        got = "no 'image' part" if image is None else f"{image.dtype} {tuple(image.shape)}"
        raise _error(
            400,
            f"the job needs an 'image' part of ({s}, {s}, 3) uint8 for {state.model.spec.name}; got {got}",
            "bad_image",
        )
    try:
        memory = check_budget(_geometry(state), state.profile, cfg.memory_budget_bytes).to_json()
    except OverBudgetError as e:
        raise _error(422, str(e), "over_memory_budget", memory=e.memory.to_json()) from e
    with reserve(state):  # the queue place is held before any network work (429 beyond the queue)
        req, manifest = await admit_template(state, req, header.get("model_id"))  # the host, then the manifest
        rows, cols = manifest.token_grid  # the template's own tokens count (it may be larger than the model's grid)
        try:
            memory = check_budget(_geometry(state), state.profile, cfg.memory_budget_bytes, rows * cols).to_json()
        except OverBudgetError as e:
            raise _error(
                422,
                f"template {req.template_id!r} ({rows}x{cols} tokens): {e}",
                "over_memory_budget",
                memory=e.memory.to_json(),
            ) from e
        job = Job(job_id=uuid.uuid4().hex, request=req, image=np.array(image), memory=memory, manifest=manifest)
        state.jobs[job.job_id] = job  # no await since the place was reserved: it passes to this job
        state.queue.put_nowait(job)
    position = len(state.queued())
    job.emit({"type": "state", "state": "queued", "position": position})
    state.forget_old()
    url = f"/v1/jobs/{job.job_id}"
    return web.json_response(
        {
            "job_id": job.job_id,
            "state": job.state,
            "position": position,
            "ws_url": url,
            "result_url": f"{url}/result",
            "memory": memory,
        },
        status=202,
        headers={"Location": url},
    )


async def _decode_body(state: AgentState, request: web.Request) -> tuple[dict, dict]:
    """The job body, decoded: one ``image`` part of exactly the model's (side, side, 3) uint8, so a part can never
    decompress to more than side² x 3 bytes. A refusal (400) is raised outside the ``except``: no traceback keeps
    the body or a half-decoded part alive."""
    s = state.model.spec.image_size
    image_bytes = s * s * 3
    limits = WireLimits(max_parts=1, max_part_bytes=image_bytes, max_total_raw_bytes=image_bytes)
    expect: dict[str, tuple[str, tuple[int, ...]]] = {"image": ("uint8", (s, s, 3))}
    body = await request.read()
    problem = None
    try:
        return await asyncio.get_running_loop().run_in_executor(None, decode_job_body, body, limits, expect)
    except WireError as e:
        problem = str(e)
    finally:
        del body
    raise _error(400, f"bad job body: {problem}", "bad_body")


async def handle_job(request: web.Request) -> web.StreamResponse:
    job = _job(request)
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return web.json_response(job.status())
    ws = web.WebSocketResponse(heartbeat=20.0)
    await ws.prepare(request)
    queue: asyncio.Queue[dict] = asyncio.Queue()
    replay = list(job.events)  # no await between this and the subscription: no event is lost or doubled
    job.listeners.add(queue)

    async def read_client() -> None:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                try:
                    kind = json.loads(msg.data).get("type")
                except (ValueError, AttributeError):
                    kind = None
                if kind == "cancel":
                    _cancel(request.app[AGENT_STATE_KEY], job, "cancelled by the host (WebSocket)")

    reader = asyncio.create_task(read_client())
    try:
        for event in replay:
            await ws.send_json(event)
        if not any(e["type"] in ("done", "error", "cancelled") for e in replay):
            while True:
                getter = asyncio.ensure_future(queue.get())
                finished, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in finished:
                    getter.cancel()
                    break  # the client went away
                event = getter.result()
                await ws.send_json(event)
                if event["type"] in ("done", "error", "cancelled"):
                    break
    except (ConnectionResetError, RuntimeError) as e:
        logger.debug("job %s: progress socket closed: %s", job.job_id, e)
    finally:
        job.listeners.discard(queue)
        reader.cancel()
        await ws.close()
    return ws


async def handle_result(request: web.Request) -> web.StreamResponse:
    job = _job(request)
    if job.state in ("queued", "running"):
        raise _error(409, f"job {job.job_id} is {job.state}; wait for its 'done' event", "not_ready", state=job.state)
    if job.state != "done":
        raise _error(410, f"job {job.job_id} {job.state}: {job.error}", job.code or job.state, state=job.state)
    import aiohttp

    with aiohttp.MultipartWriter("mixed") as mp:
        mp.append_json(job.report)
        mp.append(job.png, {"Content-Type": "image/png"})
    resp = web.Response(body=mp, headers={"Cache-Control": "no-store"})
    return resp


async def handle_delete(request: web.Request) -> web.Response:
    state = request.app[AGENT_STATE_KEY]
    job = _job(request)
    if job.finished:
        state.jobs.pop(job.job_id, None)
        return web.json_response({"job_id": job.job_id, "state": "deleted"})
    _cancel(state, job, "cancelled by the host")
    return web.json_response(
        {"job_id": job.job_id, "state": job.state if job.finished else "cancelling"},
        status=200 if job.finished else 202,
    )


# ---- app ------------------------------------------------------------------------------------------------------
def create_app(
    config: AgentConfig, *, model=None, edit_fn: EditFn | None = None, live_profile=None, resolve=None
) -> web.Application:
    """The agent app. ``model`` defaults to the demo model (``config.weights``), ``edit_fn`` to
    ``sakura_core.edit.edit_from_server`` (called as it is: ``(model, request, image, *, profile, cancel, on_layer,
    prefetch_kv_bytes, manifest[, backend])``, ``manifest`` the template's, checked when the job was admitted),
    ``live_profile`` to a measurement of ``model`` here, ``resolve`` (``(host, port) -> addresses``, the cloud host
    check's resolver: ``android_bridge.cloud_host``) to ``getaddrinfo``."""
    app = web.Application(middlewares=[_auth], client_max_size=config.max_body_bytes)
    app[AGENT_STATE_KEY] = AgentState(config, model, edit_fn, live_profile, resolve)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/v1/info", handle_info)
    app.router.add_post("/v1/jobs", handle_submit)
    app.router.add_get("/v1/jobs/{job_id}", handle_job)
    app.router.add_get("/v1/jobs/{job_id}/result", handle_result)
    app.router.add_delete("/v1/jobs/{job_id}", handle_delete)
    app.cleanup_ctx.append(_lifecycle)
    return app


def _load_model(config: AgentConfig):
    from sakura_core.models.loading import load_edit_model

    weights = None if config.weights == "none" else config.weights
    return load_edit_model(config.model, weights=weights, device=config.device, dtype=config.dtype)


async def _lifecycle(app: web.Application):
    state = app[AGENT_STATE_KEY]
    loop = asyncio.get_running_loop()
    if state.model is None:
        state.model = await loop.run_in_executor(None, _load_model, state.config)
    if state.edit_fn is None:
        from sakura_core.edit import edit_from_server

        state.edit_fn = edit_from_server
    if state.live_profile is None:
        state.live_profile = await loop.run_in_executor(None, measure_here, state.model)
    if state.config.backend == "qnn" and state.backend is None:
        state.backend = await loop.run_in_executor(None, open_qnn, state.model, state.config.qnn_cache_dir)
    state.geometry = DiTGeometry.of_demo(state.model)
    state.queue = asyncio.Queue()
    state.worker = asyncio.create_task(_worker(state))
    logger.info(
        "phone agent ready: profile %s, model %s (%s)", state.profile.name, state.model.spec.name, state.model_id[:16]
    )
    yield
    for job in list(state.jobs.values()):
        _cancel(state, job, "the agent is shutting down")
    state.worker.cancel()
    try:
        await state.worker
    except asyncio.CancelledError:
        pass
    state.queue = None
