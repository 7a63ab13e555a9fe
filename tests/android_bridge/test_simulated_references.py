"""The phone agent's SIMULATED phone-scale section of a template of two references: the phone-class DiT holds two
template images (twice the template tokens and KV of one), so the simulated edit fetches twice the bytes."""

from __future__ import annotations

from typed_manifests import unchecked_manifest

from android_bridge.simulated import simulate_phone_job
from sakura_core.fetch.traces import Trace
from sakura_core.runtime.profiles import PROFILES

from ..synthetic_templates import build_synthetic


def _manifest(template_id: str, refs: int) -> dict:
    """A synthetic template of ``refs`` 16x16 references: their grids stacked, each level ``refs`` times the bytes."""
    t = build_synthetic(
        template_id,
        model_id="ab" * 32,
        token_grid=(16 * refs, 16),
        level_bytes=tuple(refs * b for b in (1024, 4096, 8192)),
    )
    manifest = {**t.manifest, "rope_layout": "flux2-ref-t10" + (f"-x{refs}" if refs > 1 else "")}
    for shard in manifest["shards"]:  # the exact top level is the fp16 one, as the codec names it
        shard["representations"][-1]["name"] = "fp16"
    return manifest


def test_two_references_are_twice_the_phones_template():
    profile = PROFILES["snapdragon-8-elite-cpu"]
    trace = Trace.constant(50.0, name="fixed-50")
    one, two = (
        simulate_phone_job(unchecked_manifest(_manifest(f"tpl-{n}", n)), "fetch-fp16", profile, steps=4, trace=trace)
        for n in (1, 2)
    )
    tokens = profile.model.template_tokens
    assert one["model"].endswith(f"{tokens} template tokens") and two["model"].endswith(
        f"{2 * tokens} template tokens"
    )
    assert two["bytes_fetched"] == 2 * one["bytes_fetched"]  # the phone's KV of two template images, in fp16
    assert two["latency_s"] > one["latency_s"]
