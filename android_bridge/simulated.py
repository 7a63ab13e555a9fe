"""Phone-scale latency of a job, by SIMULATION: what the same policy would take on the profile's phone.

The emulated phone computes with the small demo model on this host, so its measured latency says nothing about a
phone. This module replays the job at phone scale with :func:`sakura_core.runtime.simulate.simulate`: the template's
manifest ladder (each level's size relative to fp16, its decode cost and distortion) is scaled to the phone-class
DiT of the device profile (``profile.model``), the device times come from the profile, and the link is the job's
bandwidth (a fixed rate or a trace) or, for a live link, the throughput the job measured. Every number it returns
is labelled as simulated.
"""

from __future__ import annotations

import logging

from sakura_core.fetch.traces import Trace
from sakura_core.kv.manifest import Manifest, as_manifest
from sakura_core.policy.ladder import Level, rungs_from_manifest
from sakura_core.policy.plan import floor_index, policy_levels, psnr_of
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.emulated_device import profile_for_template
from sakura_core.runtime.oracle import simulate_oracle
from sakura_core.runtime.profiles import DeviceProfile
from sakura_core.runtime.simulate import simulate

__all__ = ["SIMULATION_LABEL", "phone_ladder", "simulate_phone_job"]

logger = logging.getLogger(__name__)

SIMULATION_LABEL = (
    "SIMULATED phone-scale latency (not measured): the job's policy replayed on the device profile's phone-class DiT "
    "with the template's ladder scaled to it"
)
_DECODE_BYTES_PER_S = 6e8  # fp16-equivalent bytes a phone core decodes per second (the live runtime's assumption)


def _manifest_fp16_shard_bytes(manifest: Manifest) -> int:
    rows, cols = manifest.token_grid
    return 2 * rows * cols * manifest.heads * manifest.head_dim * 2  # K and V, 2 bytes each


def phone_ladder(manifest: Manifest, profile: DeviceProfile, fp16_only: bool = False) -> tuple[list[list[Level]], int]:
    """Per phone layer, the manifest's levels scaled to the phone DiT's shard size; and the quality floor index."""
    rungs = rungs_from_manifest(manifest, _DECODE_BYTES_PER_S)
    if fp16_only:
        (idx,) = policy_levels([r.level.name for r in rungs[0]], "fp16")
        rungs = [[lad[idx]] for lad in rungs]
    scale = profile.model.shard_bytes_fp16 / _manifest_fp16_shard_bytes(manifest)
    demo_layers, phone_layers = len(rungs), profile.model.layers
    out = []
    for layer in range(phone_layers):
        src = rungs[layer * demo_layers // phone_layers]  # spread the demo's layers over the phone's
        out.append(
            [
                Level(
                    name=lv.name,
                    nbytes=int(round(lv.nbytes * scale)),
                    increment_bytes=int(round(lv.increment_bytes * scale)),
                    decode_s=lv.decode_s * scale,
                    mse=lv.mse * demo_layers / phone_layers,
                    progressive=lv.progressive,
                )
                for lv in (r.level for r in src)
            ]
        )
    return out, floor_index([lv.name for lv in out[0]], psnr_of(rungs[0]))


def simulate_phone_job(
    manifest: Manifest | dict,
    policy_name: str,
    profile: DeviceProfile,
    *,
    steps: int,
    trace: Trace | None = None,
    measured_bytes_per_s: float | None = None,
) -> dict:
    """The simulated phone-scale run of a job as a report section (see the module doc).

    Args:
        steps: the job's denoising steps: the phone-class DiT runs as many (its geometry's own ``steps`` is only a
            default of the simulator's benchmarks).
        trace: the job's emulated link; ``None`` for a live link.
        measured_bytes_per_s: throughput the live job saw; used as a constant link when ``trace`` is None
            (falls back to ``profile.link_mbit_s``).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if trace is None:
        if measured_bytes_per_s and measured_bytes_per_s > 0:
            trace = Trace.constant(measured_bytes_per_s * 8 / 1e6, name="measured-live")
        else:
            trace = Trace.constant(profile.link_mbit_s, name=f"{profile.name}-typical")
    manifest = as_manifest(manifest)
    profile = profile_for_template(profile, manifest)  # several references: as many phone template images
    profile = profile.with_geometry(profile.model.with_fields(steps=steps))  # the job's steps, not the geometry's
    policy = make_policy(policy_name)
    ladder, floor = phone_ladder(manifest, profile, fp16_only=policy.family == "fp16")
    ladders = {policy.family: ladder}
    floors = {policy.family: floor}
    sim = simulate_oracle if policy.name == "oracle" else simulate
    run = sim(policy, trace, profile, ladders, floors)
    result = run.result
    return {
        "label": SIMULATION_LABEL,
        "profile": profile.name,
        "soc": profile.soc,
        "model": f"phone-class DiT: {profile.model.layers} layers, {profile.model.heads}x{profile.model.head_dim} "
        f"heads, {profile.model.image_tokens} image + {profile.model.template_tokens} template tokens",
        "link": trace.name,
        "policy": policy.name,
        "steps": profile.model.steps,
        "latency_s": round(float(result.latency_s), 4),
        "split_layer": int(result.split_layer),
        "bytes_fetched": int(result.bytes_fetched),
        "stall_s": round(float(run.stall_s), 4),
    }
