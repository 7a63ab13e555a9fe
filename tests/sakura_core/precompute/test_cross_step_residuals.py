"""precompute_template's cross-step residuals (sakura ladder, per-step KV): one direct blob per residual level whose
base header carries the predictor scale, decoding closer to the exact step than reusing the step before it."""

import numpy as np
import pytest

from sakura_core.kv import decode_per_step, parse_shard
from sakura_core.precompute import ProbeConfig, precompute_template
from sakura_core.runtime.schedule import flow_timesteps

STEPS, SHIFT = 2, 1.0


@pytest.fixture(scope="module")
def template(demo_model, demo_template):
    return precompute_template(
        demo_model,
        demo_template,
        "astro-xs",
        probes=ProbeConfig(num_probes=2),
        held_out_probes=1,
        psnr_steps=0,
        kv_mode="per-step",
        steps=STEPS,
        shift=SHIFT,
    )


@pytest.fixture(scope="module")
def exact(demo_model, demo_template):
    ref = demo_model.template_tokens(demo_template)
    return demo_model.adapter.extract_per_step_kv(ref, demo_model.spec.grid, flow_timesteps(STEPS, SHIFT)[:-1])


def test_residual_levels_are_direct_blobs_carrying_the_predictor(template):
    residuals = [
        r
        for sh in template.manifest["shards"]
        if sh["step"] == 1
        for r in sh["representations"]
        if (r.get("ref") or {}).get("mode") == "residual"
    ]
    assert residuals and all(r["requires"] == [] and r["total_bytes"] == r["bytes"] for r in residuals)
    headers = [parse_shard(template.blobs[r["digest"]])[0] for r in residuals]
    assert all(h.ref_scale is not None and h.parent is None and h.step == 1 for h in headers)
    scales = np.concatenate([np.frombuffer(h.ref_scale, np.int8) for h in headers])
    assert (scales != 0).mean() > 0.5  # the steps do scale channels: not a plain difference in disguise
    step0 = [r for sh in template.manifest["shards"] if sh["step"] == 0 for r in sh["representations"]]
    assert all(parse_shard(template.blobs[r["digest"]])[0].ref_scale is None for r in step0)
    assert any(r["requires"] for r in step0)  # step 0 stays progressive


def test_every_residual_level_decodes_closer_than_reusing_the_previous_step(template, exact):
    m, blobs = template.manifest, template.blobs
    names = [r["name"] for r in m["shards"][0]["representations"] if r["codec"] == "sakura"]
    x1 = exact.kv[1].float()  # (layers, 2, tokens, heads, head_dim)
    errs = []
    for name in names:
        d = decode_per_step(m["shards"], blobs, name, STEPS)  # (steps, layers, 2, tokens, heads, head_dim)
        reused = float(((d[0] - x1) ** 2).mean())  # the zero-byte rung at this level: step 0's KV as decoded
        errs.append(float(((d[1] - x1) ** 2).mean()))
        assert errs[-1] < reused, name
    assert errs[-1] < 0.05 * errs[0]  # the ladder buys accuracy: top level far below the cheapest
