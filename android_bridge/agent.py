"""The phone agent: an aiohttp app that runs private edits on the phone (or on an emulated phone, here).

Routes (every ``/v1`` route needs ``Authorization: Bearer <pairing token>``; 401 otherwise)::

    GET    /healthz                   liveness, no token, no information
    GET    /v1/info                   device profile, model id, memory budget, queue
    POST   /v1/jobs                   a job body (android_bridge.wire: JSON header + zstd tensor parts, sha256 each)
                                      -> 202 {job_id, ...}; 400 bad body, 409 model not held, 413 too large,
                                      422 over the memory budget, 429 queue full, 502 cloud unreachable
    GET    /v1/jobs/{id}              job status (JSON); with a WebSocket upgrade: progress events
    GET    /v1/jobs/{id}/result       multipart/mixed: the JSON report, then the edited image as PNG
    DELETE /v1/jobs/{id}              cancel a queued or running job (between layers); forget a finished one

WebSocket events (JSON): ``{"type": "state", "state": "queued"|"running"}``, ``{"type": "progress", "step",
"layer", "steps", "layers", "done", "total"}``, then exactly one of ``{"type": "done", "result_url"}``,
``{"type": "error", "code", "error"}``, ``{"type": "cancelled", "reason"}``. A client may send ``{"type":
"cancel"}``. Events so far are replayed to a late subscriber (progress coalesced to the latest).

The phone fetches the template's manifest, image and KV shards from the cloud itself
(:func:`sakura_core.runtime.session.edit_from_server`); the user image and prompt arrive here only and are never
forwarded. One job runs at a time; ``queue_size`` more may wait.
"""

from __future__ import annotations

import asyncio
import hmac
import io
import json
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from aiohttp import WSMsgType, web

from sakura_core.runtime.profiles import DeviceProfile, get_profile

from .budget import DiTGeometry, OverBudgetError, check_budget
from .wire import CONTENT_TYPE, WireError, WireLimits, decode_job_body

__all__ = ["AGENT_STATE_KEY", "AgentConfig", "AgentState", "Job", "create_app", "encode_png"]

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
_TERMINAL = ("done", "failed", "cancelled")
_MAX_STEPS = 1000
_TEMPLATE_ID = re.compile(r"[a-z0-9-]{1,64}")


@dataclass(frozen=True)
class AgentConfig:
    """Configuration of the phone agent.

    Attributes:
        token: pairing token every ``/v1`` request must carry (>= 8 printable characters, no spaces).
        profile: device profile name (``sakura_core.runtime.profiles.PROFILES``).
        host: address to bind (loopback for ``adb forward``; a LAN address only with a strong token).
        port: TCP port; 0 picks a free one.
        queue_size: jobs that may wait behind the running one; more get 429.
        max_body_bytes: largest job body (bytes); larger gets 413.
        memory_budget_bytes: overrides the profile's budget (e.g. what this phone has free); None = the profile's.
        jobs_kept: finished jobs kept for their result; older ones are forgotten.
        manifest_timeout_s: how long ``POST /v1/jobs`` waits for the template's manifest (model check).
        job_timeout_s: a running job is cancelled after this many seconds.
        simulate_phone: add the profile's SIMULATED phone-scale latency to each report.
        weights: demo model weights: "auto" (trained if present, else the seeded random init), "none", or a path.
    """

    token: str
    profile: str = "snapdragon-8-elite-npu"
    host: str = "127.0.0.1"
    port: int = 8765
    queue_size: int = 2
    max_body_bytes: int = 16 * 2**20
    memory_budget_bytes: int | None = None
    jobs_kept: int = 16
    manifest_timeout_s: float = 15.0
    job_timeout_s: float = 600.0
    simulate_phone: bool = True
    weights: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.token, str) or len(self.token) < 8 or not self.token.isprintable() or " " in self.token:
            raise ValueError("token must be at least 8 printable characters without spaces (the pairing token)")
        get_profile(self.profile)  # raises naming the choices
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0 = any free port), got {self.port}")
        if self.queue_size < 0 or self.jobs_kept < 1 or self.max_body_bytes < 1024:
            raise ValueError(
                f"queue_size must be >= 0, jobs_kept >= 1 and max_body_bytes >= 1024, got {self.queue_size}, "
                f"{self.jobs_kept}, {self.max_body_bytes}"
            )
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise ValueError(
                f"memory_budget_bytes must be >= 1 (or None for the profile's), got {self.memory_budget_bytes}"
            )
        if self.manifest_timeout_s <= 0 or self.job_timeout_s <= 0:
            raise ValueError("manifest_timeout_s and job_timeout_s must be > 0")

    @property
    def device_profile(self) -> DeviceProfile:
        return get_profile(self.profile)


@dataclass
class Job:
    """One edit job; lives on the event loop (``emit`` is only called there)."""

    job_id: str
    request: Any  # sakura_core.runtime.session.EditRequest
    image: np.ndarray
    memory: dict
    manifest: dict | None = None
    state: str = "queued"
    created_s: float = field(default_factory=time.monotonic)
    started_s: float | None = None
    finished_s: float | None = None
    events: list[dict] = field(default_factory=list)
    listeners: set = field(default_factory=set)
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    png: bytes | None = None
    report: dict | None = None
    error: str | None = None
    code: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in _TERMINAL

    def emit(self, event: dict) -> None:
        if event["type"] == "progress" and self.events and self.events[-1]["type"] == "progress":
            self.events[-1] = event  # replay keeps the latest progress only
        else:
            self.events.append(event)
        for queue in list(self.listeners):
            queue.put_nowait(event)

    def status(self) -> dict:
        last = next((e for e in reversed(self.events) if e["type"] == "progress"), None)
        return {
            "job_id": self.job_id,
            "state": self.state,
            "template_id": self.request.template_id,
            "progress": {k: last[k] for k in ("done", "total")} if last else None,
            "error": self.error,
            "code": self.code,
            "result_url": f"/v1/jobs/{self.job_id}/result" if self.state == "done" else None,
        }


EditFn = Callable[..., Awaitable[Any]]


class AgentState:
    """Everything one agent app owns: model, measured compute profile, jobs, queue, worker."""

    def __init__(self, config: AgentConfig, model, edit_fn: EditFn | None, live_profile):
        self.config = config
        self.profile = config.device_profile
        self.model = model
        self.edit_fn = edit_fn
        self.live_profile = live_profile
        self.geometry: DiTGeometry | None = None
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.queue: asyncio.Queue[Job] | None = None  # admission is bounded by ``queue_size`` in handle_submit
        self.running: Job | None = None
        self.worker: asyncio.Task | None = None

    @property
    def model_id(self) -> str:
        return self.model.model_id

    def queued(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state == "queued"]

    def unfinished(self) -> int:
        return sum(1 for j in self.jobs.values() if not j.finished)

    def forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.finished]
        for job in finished[: max(0, len(finished) - self.config.jobs_kept)]:
            self.jobs.pop(job.job_id, None)


AGENT_STATE_KEY = web.AppKey("agent_state", AgentState)


# ---- helpers --------------------------------------------------------------------------------------------------
def _error(status: int, message: str, code: str, headers: dict | None = None, **extra) -> web.HTTPException:
    cls = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        404: web.HTTPNotFound,
        409: web.HTTPConflict,
        410: web.HTTPGone,
        415: web.HTTPUnsupportedMediaType,
        422: web.HTTPUnprocessableEntity,
        429: web.HTTPTooManyRequests,
        502: web.HTTPBadGateway,
        503: web.HTTPServiceUnavailable,
    }[status]
    body = json.dumps({"error": message, "code": code, "status": status, **extra})
    return cls(text=body, content_type="application/json", headers=headers)


def encode_png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _job(request: web.Request) -> Job:
    state = request.app[AGENT_STATE_KEY]
    job_id = request.match_info["job_id"]
    job = state.jobs.get(job_id) if len(job_id) == 32 and all(c in "0123456789abcdef" for c in job_id) else None
    if job is None:
        raise _error(404, f"no job {job_id[:40]!r} (finished jobs are kept for the last {state.config.jobs_kept})",
                     "no_such_job")  # fmt: skip
    return job


@web.middleware
async def _auth(request: web.Request, handler):
    if request.path.startswith("/v1/"):
        state = request.app[AGENT_STATE_KEY]
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        given = given.strip()
        if (
            scheme.lower() != "bearer"
            or not given
            or not hmac.compare_digest(given.encode(), state.config.token.encode())
        ):
            raise _error(401, "a valid pairing token is required (Authorization: Bearer <token>)", "unauthorized",
                         {"WWW-Authenticate": 'Bearer realm="sakura-phone"'})  # fmt: skip
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


def _job_memory(state: AgentState) -> dict:
    try:
        return check_budget(state.geometry, state.profile, state.config.memory_budget_bytes).to_json()
    except OverBudgetError as e:
        return e.memory.to_json()


def _edit_request(job: dict):
    from sakura_core.runtime.session import EditRequest

    required = ("template_id", "cloud_url", "prompt")
    missing = [k for k in required if k not in job]
    if missing:
        raise ValueError(f"job header lacks {', '.join(missing)}")
    template_id = job["template_id"]
    if not isinstance(template_id, str) or not _TEMPLATE_ID.fullmatch(template_id):
        raise ValueError(f"template_id must match [a-z0-9-]{{1,64}}, got {str(template_id)[:80]!r}")
    url = job["cloud_url"]
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"cloud_url must be an http(s) URL of a SAKURA server, got {str(url)[:100]!r}")
    if not isinstance(job["prompt"], str) or len(job["prompt"]) > 4096:
        raise ValueError("prompt must be a string of at most 4096 characters")
    steps, seed = job.get("steps", 8), job.get("seed", 0)
    for name, value in (("steps", steps), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if not 1 <= steps <= _MAX_STEPS:
        raise ValueError(f"steps must be in 1..{_MAX_STEPS}, got {steps}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in 0..2**63-1, got {seed}")
    bandwidth = job.get("bandwidth")
    if isinstance(bandwidth, str) and bandwidth.startswith("trace:"):
        raise ValueError("bandwidth 'trace:<path>' reads a file on the phone; send 'live' or 'fixed:<Mbit/s>'")
    token = job.get("cloud_token")
    return EditRequest(
        server_url=url.rstrip("/"),
        template_id=template_id,
        prompt=job["prompt"],
        steps=steps,
        seed=seed,
        policy=job.get("policy", "sakura"),
        bandwidth=bandwidth,
        token=token if isinstance(token, str) and token else None,
    )


async def _check_template(state: AgentState, req, declared_model_id: str | None) -> dict:
    """The template's manifest; refuse a template made for a model this phone does not hold (409), or that does not
    exist (404). Only the template id and the cloud token go to the cloud."""
    from sakura_core.fetch.client import (
        AuthError,
        FetchError,
        ModelMismatchError,
        ShardClient,
        TemplateNotFoundError,
    )

    held = state.model_id
    if declared_model_id is not None and declared_model_id != held:
        raise _error(409, f"this phone does not hold model {str(declared_model_id)[:16]}…; it holds {held[:16]}… "
                          f"({state.model.spec.name})", "model_not_held", held_model_id=held)  # fmt: skip
    try:
        async with ShardClient(req.server_url, req.token) as client:
            return await asyncio.wait_for(
                client.get_manifest(req.template_id, expected_model_id=held), state.config.manifest_timeout_s
            )
    except ModelMismatchError as e:
        raise _error(409, f"template {req.template_id!r} was computed for another model than the one this phone "
                          f"holds ({held[:16]}…, {state.model.spec.name}): {e}", "model_not_held",
                     held_model_id=held) from e  # fmt: skip
    except TemplateNotFoundError as e:
        raise _error(404, f"the cloud has no template {req.template_id!r}", "template_not_found") from e
    except AuthError as e:
        raise _error(502, f"the cloud refused this phone's token: {e}", "cloud_auth") from e
    except (FetchError, asyncio.TimeoutError, OSError) as e:
        raise _error(502, f"cannot reach the cloud at {req.server_url}: {e!r}", "cloud_unreachable") from e


async def handle_submit(request: web.Request) -> web.Response:
    state = request.app[AGENT_STATE_KEY]
    cfg = state.config
    if request.content_type != CONTENT_TYPE:
        raise _error(415, f"send the job as {CONTENT_TYPE} (android_bridge.wire), not {request.content_type!r}",
                     "unsupported_media_type")  # fmt: skip
    if request.content_length is not None and request.content_length > cfg.max_body_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=cfg.max_body_bytes, actual_size=request.content_length)
    if state.queue is None:
        raise _error(503, "the agent is starting or stopping", "unavailable")
    body = await request.read()
    limits = WireLimits(max_part_bytes=cfg.max_body_bytes * 64, max_total_raw_bytes=cfg.max_body_bytes * 64)
    try:
        header, parts = await asyncio.get_running_loop().run_in_executor(None, decode_job_body, body, limits)
    except WireError as e:
        raise _error(400, f"bad job body: {e}", "bad_body") from e
    try:
        req = _edit_request(header)
    except (ValueError, TypeError) as e:
        raise _error(400, f"bad job header: {e}", "bad_job") from e
    s = state.model.spec.image_size
    image = parts.get("image")
    if image is None or image.dtype != np.uint8 or image.shape != (s, s, 3):
        got = "no 'image' part" if image is None else f"{image.dtype} {tuple(image.shape)}"
        raise _error(400, f"the job needs an 'image' part of ({s}, {s}, 3) uint8 for {state.model.spec.name}; got {got}",
                     "bad_image")  # fmt: skip
    try:
        memory = check_budget(state.geometry, state.profile, cfg.memory_budget_bytes).to_json()
    except OverBudgetError as e:
        raise _error(422, str(e), "over_memory_budget", memory=e.memory.to_json()) from e
    _admit(state)
    manifest = await _check_template(state, req, header.get("model_id"))
    _admit(state)  # again: other jobs may have arrived while the manifest was fetched
    job = Job(job_id=uuid.uuid4().hex, request=req, image=np.array(image), memory=memory, manifest=manifest)
    state.jobs[job.job_id] = job
    state.queue.put_nowait(job)
    position = len(state.queued())
    job.emit({"type": "state", "state": "queued", "position": position})
    state.forget_old()
    url = f"/v1/jobs/{job.job_id}"
    return web.json_response(
        {"job_id": job.job_id, "state": job.state, "position": position, "ws_url": url,
         "result_url": f"{url}/result", "memory": memory},
        status=202,
        headers={"Location": url},
    )  # fmt: skip


def _admit(state: AgentState) -> None:
    """One job runs, ``queue_size`` more may wait; anything beyond gets 429."""
    size = state.config.queue_size
    if state.unfinished() >= size + 1:
        raise _error(429, f"the phone is busy: {len(state.queued())} job(s) waiting (queue size {size})",
                     "queue_full", {"Retry-After": "5"})  # fmt: skip


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


def _cancel(state: AgentState, job: Job, reason: str) -> None:
    if job.finished:
        return
    job.cancel_reason = reason
    job.cancel.set()
    if job.state == "queued":  # the worker will skip it; tell subscribers now
        _finish(job, "cancelled", error=reason, code="cancelled")


def _finish(job: Job, state: str, *, error: str | None = None, code: str | None = None) -> None:
    job.state, job.error, job.code = state, error, code
    job.finished_s = time.monotonic()
    if state == "done":
        job.emit({"type": "done", "result_url": f"/v1/jobs/{job.job_id}/result"})
    elif state == "cancelled":
        job.emit({"type": "cancelled", "reason": error})
    else:
        job.emit({"type": "error", "code": code, "error": error})
    job.image = np.empty((0,), np.uint8)  # drop the private image as soon as the job ends


async def handle_delete(request: web.Request) -> web.Response:
    state = request.app[AGENT_STATE_KEY]
    job = _job(request)
    if job.finished:
        state.jobs.pop(job.job_id, None)
        return web.json_response({"job_id": job.job_id, "state": "deleted"})
    _cancel(state, job, "cancelled by the host")
    return web.json_response({"job_id": job.job_id, "state": job.state if job.finished else "cancelling"},
                             status=200 if job.finished else 202)  # fmt: skip


# ---- worker ---------------------------------------------------------------------------------------------------
def _error_code(e: BaseException) -> str:
    from sakura_core.fetch.client import AuthError, FetchError, ModelMismatchError, TemplateNotFoundError

    for cls, code in (
        (ModelMismatchError, "model_not_held"),
        (TemplateNotFoundError, "template_not_found"),
        (AuthError, "cloud_auth"),
        (FetchError, "fetch_failed"),
        (ValueError, "bad_job"),
    ):
        if isinstance(e, cls):
            return code
    return "internal"


async def _run_one(state: AgentState, job: Job) -> None:
    from sakura_core.runtime.pipeline import Cancelled

    loop = asyncio.get_running_loop()
    layers = state.model.adapter.num_layers
    total = job.request.steps * layers

    def on_layer(step: int, layer: int) -> None:  # compute thread
        event = {"type": "progress", "step": step, "layer": layer, "steps": job.request.steps, "layers": layers,
                 "done": step * layers + layer + 1, "total": total}  # fmt: skip
        loop.call_soon_threadsafe(job.emit, event)

    def timeout() -> None:
        _cancel(state, job, f"job timeout: over {state.config.job_timeout_s:.0f} s")

    job.state, job.started_s = "running", time.monotonic()
    job.emit({"type": "state", "state": "running"})
    timer = loop.call_later(state.config.job_timeout_s, timeout)
    try:
        outcome = await state.edit_fn(
            state.model, job.request, job.image, profile=state.live_profile, cancel=job.cancel, on_layer=on_layer
        )
        png = await loop.run_in_executor(None, encode_png, outcome.image)
        report = await loop.run_in_executor(None, _report, state, job, outcome)
    except Cancelled:
        _finish(job, "cancelled", error=job.cancel_reason or "cancelled", code="cancelled")
    except asyncio.CancelledError:
        _finish(job, "cancelled", error="the agent is shutting down", code="cancelled")
        raise
    except Exception as e:  # noqa: BLE001 - any failure ends this job with its message; the agent keeps serving
        if job.cancel.is_set():
            _finish(job, "cancelled", error=job.cancel_reason or "cancelled", code="cancelled")
        else:
            code = _error_code(e)
            if code == "internal":
                logger.exception("job %s failed", job.job_id)
            _finish(job, "failed", error=f"{type(e).__name__}: {e}", code=code)
    else:
        job.png, job.report = png, report
        _finish(job, "done")
    finally:
        timer.cancel()


def _report(state: AgentState, job: Job, outcome) -> dict:
    import hashlib

    p = state.profile
    report = dict(outcome.report)
    report.update(
        {
            "job_id": job.job_id,
            "steps": job.request.steps,
            "seed": job.request.seed,
            "image_sha256": hashlib.sha256(np.ascontiguousarray(outcome.image).tobytes()).hexdigest(),
            "device": {
                "profile": p.name,
                "soc": p.soc,
                "emulated": True,
                "compute": "this host's CPU running the demo model (emulated phone); latency_s is measured here",
                "model_id": state.model_id,
            },
            "memory": job.memory,
            "agent": {
                "queued_s": round((job.started_s or job.created_s) - job.created_s, 4),
                "run_s": round(time.monotonic() - (job.started_s or job.created_s), 4),
            },
        }
    )
    if state.config.simulate_phone:
        report["simulated_phone"] = _simulate(state, job, outcome)
    return report


def _simulate(state: AgentState, job: Job, outcome) -> dict:
    """The SIMULATED phone-scale latency; a failure here is reported in the section, never fails the job."""
    from sakura_core.runtime.session import parse_bandwidth

    from .simulated import simulate_phone_job

    try:
        if job.manifest is None:
            raise ValueError("no manifest was fetched for this job")
        fetch_s = sum(e["end"] - e["start"] for e in outcome.report.get("timeline", []) if e.get("lane") == "fetch")
        measured = outcome.report.get("bytes_fetched", 0) / fetch_s if fetch_s > 0 else None
        return simulate_phone_job(job.manifest, job.request.policy, state.profile,
                                  trace=parse_bandwidth(job.request.bandwidth), measured_bytes_per_s=measured)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the simulation is an annotation; say why it is missing
        logger.info("job %s: no simulated phone latency: %s", job.job_id, e)
        return {"label": "SIMULATION unavailable", "error": f"{type(e).__name__}: {e}"}


async def _worker(state: AgentState) -> None:
    while True:
        job = await state.queue.get()
        try:
            if job.finished:  # cancelled while queued
                continue
            state.running = job
            await _run_one(state, job)
        finally:
            state.running = None
            state.queue.task_done()
            state.forget_old()


# ---- app ------------------------------------------------------------------------------------------------------
def create_app(
    config: AgentConfig, *, model=None, edit_fn: EditFn | None = None, live_profile=None
) -> web.Application:
    """The agent app. ``model`` defaults to the demo model (``config.weights``), ``edit_fn`` to
    ``sakura_core.runtime.session.edit_from_server``, ``live_profile`` to a measurement of ``model`` here."""
    app = web.Application(middlewares=[_auth], client_max_size=config.max_body_bytes)
    app[AGENT_STATE_KEY] = AgentState(config, model, edit_fn, live_profile)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/v1/info", handle_info)
    app.router.add_post("/v1/jobs", handle_submit)
    app.router.add_get("/v1/jobs/{job_id}", handle_job)
    app.router.add_get("/v1/jobs/{job_id}/result", handle_result)
    app.router.add_delete("/v1/jobs/{job_id}", handle_delete)
    app.cleanup_ctx.append(_lifecycle)
    return app


def _load_model(weights: str):
    from sakura_core.models.demo import load_demo_model

    return load_demo_model(weights=None if weights == "none" else weights)


def _measure(model):
    """Per-layer compute times of ``model`` here (the policies predict with them); synthetic images only."""
    from sakura_core.bench.cli_live import measure_profile

    s = model.spec.image_size
    ramp = np.linspace(0, 255, s * s * 3, dtype=np.float32).reshape(s, s, 3).astype(np.uint8)
    return measure_profile(model, ramp, ramp[::-1].copy(), steps=8)


async def _lifecycle(app: web.Application):
    state = app[AGENT_STATE_KEY]
    loop = asyncio.get_running_loop()
    if state.model is None:
        state.model = await loop.run_in_executor(None, _load_model, state.config.weights)
    if state.edit_fn is None:
        from sakura_core.runtime.session import edit_from_server

        state.edit_fn = edit_from_server
    if state.live_profile is None:
        state.live_profile = await loop.run_in_executor(None, _measure, state.model)
    state.geometry = DiTGeometry.of_demo(state.model)
    state.queue = asyncio.Queue()
    state.worker = asyncio.create_task(_worker(state))
    logger.info("phone agent ready: profile %s, model %s (%s)", state.profile.name, state.model.spec.name,
                state.model_id[:16])  # fmt: skip
    yield
    for job in list(state.jobs.values()):
        _cancel(state, job, "the agent is shutting down")
    state.worker.cancel()
    try:
        await state.worker
    except asyncio.CancelledError:
        pass
    state.queue = None
