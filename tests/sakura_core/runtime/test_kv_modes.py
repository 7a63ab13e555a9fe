"""KV modes in the simulator: per-step = steps x layers shards, the template at every step on the device."""

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.simulate import kv_mode_view, simulate

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=3
)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1, layer_overhead_s=1e-3), DeviceMemory(0), model=G)


def _ladders(profile):
    g = profile.model
    fp = g.shard_bytes_fp16
    levels = [Level("q", fp // 6, fp // 6, 1e-3, 1e-4 / g.layers), Level("fp16", fp, fp, 1e-3, 0.0)]
    return {"sakura": [levels] * g.layers, "fp16": [[levels[1]]] * g.layers}, {"sakura": 0, "fp16": 0}


def _run(name, profile, mbit=50.0):
    lad, fl = _ladders(profile)
    return simulate(make_policy(name), Trace.constant(mbit), profile, lad, fl)


def test_per_step_view_has_steps_x_layers_shards_and_one_step():
    v = kv_mode_view(P, "per-step")
    assert v.model.layers == 12 and v.model.steps == 1
    assert v.model.kv_bytes_fp16 == 3 * G.kv_bytes_fp16
    assert v.layer_full_s == P.layer_full_s and v.template_pass_s == pytest.approx(3 * P.template_pass_s)
    assert kv_mode_view(P, "single") is P
    with pytest.raises(ValueError, match="unknown kv_mode"):
        kv_mode_view(P, "twice")


def test_on_device_pays_the_template_every_step_in_per_step_mode():
    v = kv_mode_view(P, "per-step")
    single_cached = _run("on-device-cached", P).result.latency_s
    per_step = _run("on-device-cached", v).result.latency_s
    # single: one template pass (step 0 runs the template), cached after; per-step: the template at every step
    assert single_cached == pytest.approx(4 * P.layer_full_s + 2 * 4 * P.layer_cached_s + 0.1)
    assert per_step == pytest.approx(12 * P.layer_full_s + 0.1)
    assert per_step == pytest.approx(_run("on-device", v).result.latency_s)
    assert _run("fetch-fp16", v).result.bytes_fetched == 3 * _run("fetch-fp16", P).result.bytes_fetched


def test_fetching_pays_more_in_per_step_mode():
    single, per = P, kv_mode_view(P, "per-step")
    gain_single = _run("on-device-cached", single).result.latency_s / _run("free-kv", single).result.latency_s
    gain_per = _run("on-device-cached", per).result.latency_s / _run("free-kv", per).result.latency_s
    assert gain_per > gain_single
