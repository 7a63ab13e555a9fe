"""The phone agent's worker: runs one job at a time through the core edit (``sakura_core.edit``) and adds where it
ran to the core's report."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sakura_core.files import png_bytes

from .agent_state import AgentState, Job, _cancel, _finish, compute_description

if TYPE_CHECKING:
    from sakura_core.runtime.backend import ComputeBackend

__all__ = ["measure_here", "open_qnn"]  # and _worker, internal to the agent: it runs the queue

logger = logging.getLogger(__name__)


# ---- worker ---------------------------------------------------------------------------------------------------
def _error_code(e: BaseException) -> str:
    from sakura_core.fetch.client import (
        AuthError,
        FetchError,
        ManifestError,
        ModelMismatchError,
        RedirectRefusedError,
        TemplateNotFoundError,
    )

    for cls, code in (
        (ModelMismatchError, "model_not_held"),
        (RedirectRefusedError, "cloud_redirect"),
        (TemplateNotFoundError, "template_not_found"),
        (AuthError, "cloud_auth"),
        (ManifestError, "bad_manifest"),
        (FetchError, "fetch_failed"),
        (ValueError, "bad_job"),
    ):
        if isinstance(e, cls):
            return code
    return "internal"


def _edit_cancel_was_ours(job: Job, loop: asyncio.AbstractEventLoop) -> bool:
    """Whether a CancelledError in the worker came from the job's grace timer cancelling its edit, not from the worker
    being cancelled (the agent shutting down)."""
    task = asyncio.current_task()
    if sys.version_info >= (3, 11):
        return task is not None and task.cancelling() == 0
    # Python 3.10 has no Task.cancelling(): the grace timer has fired (it is what cancels the edit)
    return job.grace is not None and job.grace.when() <= loop.time()


async def _run_one(state: AgentState, job: Job) -> None:
    from sakura_core.runtime.pipeline import Cancelled

    loop = asyncio.get_running_loop()
    layers = state.model.adapter.num_layers
    total = job.request.settings.steps * layers

    def on_layer(step: int, layer: int) -> None:  # compute thread
        event = {
            "type": "progress",
            "step": step,
            "layer": layer,
            "steps": job.request.settings.steps,
            "layers": layers,
            "done": step * layers + layer + 1,
            "total": total,
        }
        loop.call_soon_threadsafe(job.emit, event)

    backend: dict[str, ComputeBackend] = {"backend": state.backend} if state.backend is not None else {}  # None: torch
    # the memory the job's estimate leaves under the budget is what KV prefetched for later steps may use
    room = max(int(job.memory["budget_bytes"]) - int(job.memory["total_bytes"]), 0)
    edit_fn = state.edit_fn
    assert edit_fn is not None  # set by the app's start-up (agent._lifecycle) before the worker runs
    edit = asyncio.ensure_future(
        edit_fn(
            state.model,
            job.request,
            job.image,
            profile=state.live_profile,
            cancel=job.cancel,
            on_layer=on_layer,
            prefetch_kv_bytes=room,
            manifest=job.manifest,
            **backend,
        )
    )

    def timeout() -> None:
        _cancel(state, job, f"job timeout: over {state.config.job_timeout_s:.0f} s")
        # the flag stops the compute between layers (and while it waits for a shard); an edit still awaiting the
        # network (manifest, template image) is cancelled once the grace period is over
        job.grace = loop.call_later(state.config.cancel_grace_s, edit.cancel)

    job.state, job.started_s = "running", time.monotonic()
    job.emit({"type": "state", "state": "running"})
    timer = loop.call_later(state.config.job_timeout_s, timeout)
    try:
        outcome = await edit
        png = await loop.run_in_executor(None, png_bytes, outcome.image)
        report = await loop.run_in_executor(None, _report, state, job, outcome)
    except Cancelled:
        _finish(job, "cancelled", error=job.cancel_reason or "cancelled", code="cancelled")
    except asyncio.CancelledError:
        if _edit_cancel_was_ours(job, loop) and job.cancel.is_set():  # our own grace cancel of the edit
            _finish(job, "cancelled", error=job.cancel_reason or "cancelled", code="cancelled")
            return
        edit.cancel()
        _finish(job, "cancelled", error="the agent is shutting down", code="cancelled")
        raise
    except Exception as e:  # noqa: BLE001 - any failure ends this job with its message; the agent keeps serving
        if job.cancel.is_set():
            _finish(job, "cancelled", error=job.cancel_reason or "cancelled", code="cancelled")
        else:
            code = _error_code(e)
            if code == "internal":
                logger.exception("job %s failed, the agent is at fault", job.job_id)
            else:
                side = "the job" if code in ("bad_job", "model_not_held") else f"the cloud at {job.request.source.url}"
                logger.info("job %s failed (%s), %s is at fault: %s", job.job_id, code, side, str(e)[:300])
            _finish(job, "failed", error=f"{type(e).__name__}: {e}", code=code)
    else:
        job.png, job.report = png, report
        _finish(job, "done")
    finally:
        timer.cancel()
        if job.grace is not None:
            job.grace.cancel()


def _report(state: AgentState, job: Job, outcome) -> dict:
    """The core's report (``sakura_core.edit_report``: the same shape as a local edit's) with ``executed_on``
    saying where it ran: this (emulated) phone, the job, its memory estimate and the simulated phone latency."""
    p = state.profile
    report = dict(outcome.report)
    executed_on = {
        "kind": "phone",
        "job_id": job.job_id,
        "device": {
            "profile": p.name,
            "soc": p.soc,
            "emulated": True,
            "compute": _compute_text(state),
            "backend": _backend_summary(state),
            "model_id": state.model_id,
        },
        "memory": job.memory,
        "agent": {
            "queued_s": round((job.started_s or job.created_s) - job.created_s, 4),
            "run_s": round(time.monotonic() - (job.started_s or job.created_s), 4),
        },
    }
    if state.config.simulate_phone:
        executed_on["simulated_phone"] = _simulate(state, job, outcome)
    report["executed_on"] = executed_on  # same key, same place in the report
    return report


def _compute_text(state: AgentState) -> str:
    if state.backend is None:
        return "this host's CPU running the demo model in torch (emulated phone); latency_s is measured here"
    d = state.backend.describe()
    if d.get("emulated_htp"):
        return (
            "the model's blocks ran as per-layer QNN context binaries on the EMULATED Hexagon HTP (x86-64 "
            "libQnnHtp.so, onnxruntime-qnn, CPU fallback disabled); latency_s is the emulator's, not a phone's"
        )
    return f"the model's blocks ran on {d.get('where')}"


def _backend_summary(state: AgentState) -> dict:
    d = compute_description(state)
    return {k: d[k] for k in ("backend", "emulated_htp", "precision", "soc_model", "op_coverage") if k in d}


def _simulate(state: AgentState, job: Job, outcome) -> dict:
    """The SIMULATED phone-scale latency; a failure here is reported in the section, never fails the job."""
    from .simulated import simulate_phone_job

    try:
        if job.manifest is None:
            raise ValueError("no manifest was fetched for this job")
        fetch_s = sum(e["end"] - e["start"] for e in outcome.report.get("timeline", []) if e.get("lane") == "fetch")
        measured = outcome.report.get("bytes_fetched", 0) / fetch_s if fetch_s > 0 else None
        return simulate_phone_job(
            job.manifest,
            job.request.settings.policy,
            state.profile,
            steps=job.request.settings.steps,
            trace=job.request.settings.link.trace(),
            measured_bytes_per_s=measured,
        )
    except Exception as e:  # noqa: BLE001 - the simulation is an annotation; say why it is missing
        logger.info("job %s: no simulated phone latency: %s", job.job_id, e)
        return {"label": "SIMULATION unavailable", "error": f"{type(e).__name__}: {e}"}


async def _worker(state: AgentState) -> None:
    queue = state.queue
    assert queue is not None  # made by the app's start-up, before this worker
    while True:
        job = await queue.get()
        try:
            if job.finished:  # cancelled while queued
                continue
            state.running = job
            await _run_one(state, job)
        finally:
            state.running = None
            queue.task_done()
            state.forget_old()


def open_qnn(model, cache_dir: str | None):
    """The QNN backend (context binaries built on first use, then loaded from the cache)."""
    from .npu_build import QnnBuildConfig, open_qnn_backend

    return open_qnn_backend(model, QnnBuildConfig(cache_root=None if cache_dir is None else Path(cache_dir)))


def measure_here(model):
    """Per-layer compute times of ``model`` here (the policies predict with them); content-free inputs only."""
    from sakura_core.runtime.live_profile import measure_profile

    return measure_profile(model, steps=8)
