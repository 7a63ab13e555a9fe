"""One private edit against a template served by a SAKURA server: the entry point the ComfyUI sampler node and the
phone agent both call. The user image and prompt stay in this process; only shard requests leave it.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..fetch.shaper import TraceShaper
from ..fetch.traces import Trace, load_trace
from ..models.edit_model import EditModel
from ..policy.plan import plan_fetch, runnable_policies
from .live_profile import LiveProfile
from .pipeline import RuntimeConfig, run_pipelined_edit

__all__ = [
    "EditOutcome",
    "EditRequest",
    "edit_from_server",
    "parse_bandwidth",
    "shaped_fetcher",
    "template_image_from_manifest",
]


def parse_bandwidth(spec: str | None) -> Trace | None:
    """``None``/"live" = the real link; "fixed:MBIT" = a constant emulated link; "trace:PATH" = a trace file."""
    if spec in (None, "", "live"):
        return None
    kind, _, value = spec.partition(":")
    if kind == "fixed":
        try:
            return Trace.constant(float(value))
        except ValueError as e:
            raise ValueError(f"bandwidth {spec!r}: expected fixed:<Mbit/s>, e.g. fixed:5") from e
    if kind == "trace":
        return load_trace(value)
    raise ValueError(f"bandwidth {spec!r}: use 'live', 'fixed:<Mbit/s>' or 'trace:<path>'")


@dataclass(frozen=True)
class EditRequest:
    """What to edit with (everything except the private image).

    Attributes:
        server_url: SAKURA server (or CDN) base URL.
        template_id: template to edit against.
        prompt: edit prompt (stays on the device).
        steps: denoising steps.
        seed: noise seed.
        policy: fetch policy name (see ``sakura_core.policy.policies.POLICIES``).
        bandwidth: link emulation: None/"live", "fixed:<Mbit/s>" or "trace:<path>".
        token: bearer token for a server with a read token.
        latency_target_s: the edit's latency target (seconds) or None (see ``RuntimeConfig``).
    """

    server_url: str
    template_id: str
    prompt: str
    steps: int = 8
    seed: int = 0
    policy: str = "sakura"
    bandwidth: str | None = None
    token: str | None = None
    latency_target_s: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in runnable_policies():
            raise ValueError(f"policy {self.policy!r} cannot run; choose one of {', '.join(runnable_policies())}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        parse_bandwidth(self.bandwidth)


@dataclass
class EditOutcome:
    image: np.ndarray
    report: dict


def template_image_from_manifest(blob: bytes, size: int) -> np.ndarray:
    from PIL import Image

    from ..models.edit_model import load_image

    return load_image(np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")), size)


def shaped_fetcher(client, trace: Trace | None):
    """``async (digest, nbytes) -> bytes`` over ``client``, paced by ``trace`` (None = the real link)."""
    shaper = TraceShaper(trace) if trace is not None else None

    async def fetch_blob(digest: str, nbytes: int) -> bytes:
        if shaper is None:
            return await client.fetch_shard(digest, expected_bytes=nbytes)
        await shaper.request_latency()
        return await client.fetch_shard(digest, expected_bytes=nbytes, throttle=shaper.throttle)

    return fetch_blob


async def edit_from_server(
    model: EditModel,
    request: EditRequest,
    user_image: np.ndarray,
    *,
    profile: LiveProfile,
    cancel: threading.Event | None = None,
    on_layer: Callable[[int, int], None] | None = None,
) -> EditOutcome:
    """Fetch the template's manifest, then run the pipelined edit with ``request.policy``.

    ``on_layer(step, layer)`` is called before each layer (progress); ``cancel`` stops between layers.
    """
    from ..fetch.client import ShardClient

    trace = parse_bandwidth(request.bandwidth)
    async with ShardClient(request.server_url, request.token) as client:
        manifest = await client.get_manifest(request.template_id, expected_model_id=model.model_id)
        if tuple(manifest["token_grid"]) != tuple(model.spec.grid):
            raise ValueError(f"template {request.template_id!r} has token grid {manifest['token_grid']}, "
                             f"the model edits {list(model.spec.grid)}")  # fmt: skip
        tmpl = manifest.get("template_image")
        if not tmpl:
            raise ValueError(f"template {request.template_id!r}: its manifest names no template_image; republish it")
        template = template_image_from_manifest(
            await client.fetch_shard(tmpl["digest"], expected_bytes=tmpl["bytes"]), model.spec.image_size
        )

        plan = plan_fetch(manifest, request.policy)
        report = await run_pipelined_edit(
            model, manifest, shaped_fetcher(client, trace), user_image, request.prompt, policy=plan.policy,
            ladders=plan.ladders, reps=plan.reps, floor=plan.floor, profile=profile, template_image=template,
            trace=trace, config=RuntimeConfig(steps=request.steps, seed=request.seed, latency_target_s=request.latency_target_s), cancel=cancel,
            on_layer=on_layer,
        )  # fmt: skip
    return EditOutcome(
        image=report.image,
        report={
            "policy": report.policy,
            "template_id": request.template_id,
            "latency_s": report.latency_s,
            "bytes_fetched": report.bytes_fetched,
            "split_layer": report.split_layer,
            "levels_used": report.levels_used,
            "decisions": report.decisions,
            "fallbacks": report.fallbacks,
            "timeline": report.events,
            "bandwidth": request.bandwidth or "live",
        },
    )
