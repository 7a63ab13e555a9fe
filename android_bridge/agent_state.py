"""The phone agent's state: its configuration, the jobs (queued, running, finished) and their transitions."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web

from sakura_core.http_serving import TokenThrottle, is_loopback
from sakura_core.runtime.profiles import DeviceProfile, get_profile

from .budget import DiTGeometry

if TYPE_CHECKING:
    from sakura_core.runtime.backend import ComputeBackend

__all__ = ["AGENT_STATE_KEY", "AgentConfig", "AgentState", "Job", "compute_description"]

logger = logging.getLogger(__name__)

_TERMINAL = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class AgentConfig:
    """Configuration of the phone agent.

    Attributes:
        token: pairing token every ``/v1`` request must carry (>= 8 printable characters, no spaces).
        profile: device profile name (``sakura_core.runtime.profiles.PROFILES``).
        host: address to bind: loopback (``adb forward``) unless ``allow_lan``.
        allow_lan: permit a non-loopback ``host`` (0.0.0.0, a LAN address); it then needs a token of >= 16 characters.
        port: TCP port; 0 picks a free one.
        queue_size: jobs that may wait behind the running one; more get 429.
        max_body_bytes: largest job body (bytes); larger gets 413.
        memory_budget_bytes: overrides the profile's budget (e.g. what this phone has free); None = the profile's.
        jobs_kept: finished jobs kept for their result; older ones are forgotten.
        manifest_timeout_s: how long ``POST /v1/jobs`` waits for the template's manifest (model check).
        job_timeout_s: a running job is cancelled after this many seconds.
        cancel_grace_s: after a job timeout, seconds the edit may take to stop at its next layer before whatever it
            still awaits (a fetch over a dead link) is cancelled.
        simulate_phone: add the profile's SIMULATED phone-scale latency to each report.
        weights: demo model weights: "auto" (trained if present, else the seeded random init), "none", or a path.
        backend: what runs the model's blocks: "torch" (the reference, this host's CPU) or "qnn" (per-layer context
            binaries through onnxruntime-qnn, CPU fallback disabled; on x86 the HTP is EMULATED).
        qnn_cache_dir: root of the QNN context-binary cache (one folder per model id); None = $SAKURA_QNN_CACHE or
            ~/.cache/sakura/qnn.
        model: "demo", the path of a diffusers FLUX.2 [klein] pipeline folder, or klein single files
            (``klein-files:...``; latent space: VAE + text encoder run here too; the user's image and prompt stay on
            this device).
        device: where the model runs (``cpu``, ``cuda``, ``cuda:N``, ``mps``); the torch backend only.
        dtype: the model's parameter dtype (None = float32); part of the model id: templates must be precomputed in
            the same dtype. The torch backend only (the QNN export is float32 -> w8a16).
        allow_private_cloud: whether a job's cloud may be a loopback or private (non-global) address, its host
            resolved first (``android_bridge.cloud_host``); None = only when ``host`` is loopback (the emulated phone
            beside its cloud). Link-local, multicast and unspecified addresses are refused whatever this says.
    """

    token: str
    profile: str = "snapdragon-8-elite-npu"
    host: str = "127.0.0.1"
    allow_lan: bool = False
    port: int = 8765
    queue_size: int = 2
    max_body_bytes: int = 16 * 2**20
    memory_budget_bytes: int | None = None
    jobs_kept: int = 16
    manifest_timeout_s: float = 15.0
    job_timeout_s: float = 600.0
    cancel_grace_s: float = 5.0
    simulate_phone: bool = True
    weights: str = "auto"
    backend: str = "torch"
    qnn_cache_dir: str | None = None
    model: str = "demo"
    device: str = "cpu"
    dtype: str | None = None
    allow_private_cloud: bool | None = None

    def __post_init__(self) -> None:
        from sakura_core.models.loading import check_device_dtype, check_model_source

        check_model_source(self.model)
        check_device_dtype(self.device, self.dtype)
        if self.backend not in ("torch", "qnn"):
            raise ValueError(f"backend must be 'torch' or 'qnn', got {self.backend!r}")
        if self.backend == "qnn" and (self.device != "cpu" or self.dtype not in (None, "float32", "fp32")):
            raise ValueError(
                f"backend 'qnn' exports the float32 model from the CPU; drop --device {self.device} / "
                f"--dtype {self.dtype} (or use --backend torch)"
            )
        if not isinstance(self.token, str) or len(self.token) < 8 or not self.token.isprintable() or " " in self.token:
            raise ValueError("token must be at least 8 printable characters without spaces (the pairing token)")
        get_profile(self.profile)  # raises naming the choices
        if not is_loopback(self.host):
            if not self.allow_lan:
                raise ValueError(
                    f"host {self.host!r} is not a loopback address: the agent would be reachable from "
                    "the network; pass allow_lan=True (--allow-lan) to mean it"
                )
            if len(self.token) < 16:
                raise ValueError("a LAN-reachable agent needs a pairing token of at least 16 characters")
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
        if self.manifest_timeout_s <= 0 or self.job_timeout_s <= 0 or self.cancel_grace_s <= 0:
            raise ValueError(
                f"manifest_timeout_s, job_timeout_s and cancel_grace_s must be > 0 seconds, got "
                f"{self.manifest_timeout_s}, {self.job_timeout_s}, {self.cancel_grace_s}"
            )

        if self.allow_private_cloud not in (None, True, False):
            raise ValueError(
                f"allow_private_cloud must be True, False or None (= only when host is loopback), got "
                f"{self.allow_private_cloud!r}"
            )

    @property
    def private_cloud_allowed(self) -> bool:
        """Whether loopback and private cloud hosts are allowed (``allow_private_cloud``, resolved)."""
        return is_loopback(self.host) if self.allow_private_cloud is None else self.allow_private_cloud

    @property
    def device_profile(self) -> DeviceProfile:
        return get_profile(self.profile)


@dataclass
class Job:
    """One edit job; lives on the event loop (``emit`` is only called there)."""

    job_id: str
    request: Any  # sakura_core.edit.EditRequest
    image: np.ndarray
    memory: dict
    manifest: Any = None  # sakura_core.kv.Manifest, checked against the model when the job was admitted
    state: str = "queued"
    created_s: float = field(default_factory=time.monotonic)
    started_s: float | None = None
    finished_s: float | None = None
    events: list[dict] = field(default_factory=list)
    listeners: set = field(default_factory=set)
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    grace: asyncio.TimerHandle | None = None
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

    def __init__(self, config: AgentConfig, model, edit_fn: EditFn | None, live_profile, resolve=None):
        self.config = config
        self.profile = config.device_profile
        self.model = model
        self.edit_fn = edit_fn
        self.live_profile = live_profile
        self.token_throttle = TokenThrottle()  # wrong pairing tokens per client address: 429 past 20 a minute
        self.backend: ComputeBackend | None = None  # None = the torch adapter
        self.geometry: DiTGeometry | None = None
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.queue: asyncio.Queue[Job] | None = None  # admission is bounded by ``queue_size`` in handle_submit
        self.running: Job | None = None
        self.worker: asyncio.Task | None = None
        self.admitting = 0  # jobs holding a queue place while their cloud is checked (``agent_admission``)
        self.resolve = resolve  # (host, port) -> addresses; None = getaddrinfo (``android_bridge.cloud_host``)

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


def compute_description(state: AgentState) -> dict:
    """What runs the model's blocks: the backend's own description (``/v1/info`` and each report's executed_on)."""
    from sakura_core.runtime.backend import backend_of

    return backend_of(state.model, state.backend).describe()


AGENT_STATE_KEY = web.AppKey("agent_state", AgentState)


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
