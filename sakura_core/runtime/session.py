"""One private edit against a template served by a SAKURA server: the entry point the ComfyUI sampler node and the
phone agent both call. The user image and prompt stay in this process; only shard requests leave it.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..fetch.policies import POLICIES, make_policy
from ..fetch.shaper import TraceShaper
from ..fetch.traces import Trace, load_trace
from ..models.demo import DemoModel
from .ladder import ladders_from_manifest
from .pipeline import LiveProfile, RuntimeConfig, run_pipelined_edit

__all__ = [
    "EditOutcome",
    "EditRequest",
    "FetchPlan",
    "edit_from_server",
    "parse_bandwidth",
    "plan_fetch",
    "shaped_fetcher",
    "template_image_from_manifest",
]

# A level is acceptable as the quality floor when its measured output PSNR (manifest ``psnr_db``) reaches this.
FLOOR_PSNR_DB = 35.0


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
        policy: fetch policy name (see ``sakura_core.fetch.policies.POLICIES``).
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
        if self.policy not in POLICIES or self.policy == "free-kv":
            raise ValueError(f"policy {self.policy!r} cannot run; choose one of "
                             f"{', '.join(p for p in POLICIES if p != 'free-kv')}")  # fmt: skip
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        parse_bandwidth(self.bandwidth)


@dataclass
class EditOutcome:
    image: np.ndarray
    report: dict


def template_image_from_manifest(blob: bytes, size: int) -> np.ndarray:
    from PIL import Image

    from ..models.demo import load_image

    return load_image(np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")), size)


def _floor(ladder_names: list[str], reps: list[dict]) -> int:
    by_name = {r["name"]: r for r in reps}
    for i, name in enumerate(ladder_names):
        psnr = by_name[name].get("psnr_db")
        if psnr is not None and psnr >= FLOOR_PSNR_DB:
            return i
    return len(ladder_names) - 1  # no measured level qualifies: the exact one (fp16) is last


@dataclass(frozen=True)
class FetchPlan:
    """What the runtime needs to fetch a template with one policy: the ladders, manifest entries and floor."""

    policy: object
    ladders: list
    reps: list
    floor: int

    @property
    def floor_name(self) -> str:
        return self.ladders[0][self.floor].name


def plan_fetch(manifest: dict, policy_name: str, decode_bytes_per_s: float = 6e8) -> FetchPlan:
    """Ladders for ``policy_name`` (fetch-fp16 sees only the exact representation) and the quality floor: the
    cheapest level whose measured output PSNR (manifest ``psnr_db``) reaches ``FLOOR_PSNR_DB``."""
    policy = make_policy(policy_name)
    ladders, reps = ladders_from_manifest(manifest, decode_bytes_per_s)
    names = [lv.name for lv in ladders[0]]
    if policy.family == "fp16":  # the exact representation only
        keep = [names.index("fp16")]
    elif policy.family == "cachegen":  # CacheGen's own levels: the extra fp16 reference is not part of its ladder
        keep = [i for i, n in enumerate(names) if n != "fp16"]
    else:
        keep = list(range(len(names)))
    ladders, reps = [[lad[i] for i in keep] for lad in ladders], [[r[i] for i in keep] for r in reps]
    return FetchPlan(policy, ladders, reps, _floor([lv.name for lv in ladders[0]], reps[0]))


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
    model: DemoModel,
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
