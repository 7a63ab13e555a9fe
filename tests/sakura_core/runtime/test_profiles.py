"""FLOP cost model: hand-derived FLOP counts, profile speeds from their published sources, geometry KV sizes."""

from dataclasses import replace

import pytest

from sakura_core.runtime.geometry import GEOMETRIES, DitGeometry, get_geometry
from sakura_core.runtime.profiles import (
    PROFILE_SOURCES,
    PROFILES,
    SD15_UNET_FLOPS,
    DeviceCompute,
    DeviceMemory,
    DeviceProfile,
    get_profile,
    sources_table,
)


def test_layer_costs_are_flops_over_speed_plus_overhead_hand_derived():
    # width 2 (1 head x 2), gated MLP ratio 3: linear = 2 * (4 + 9) * 2^2 = 104 FLOPs per token
    g = DitGeometry.of(name="tiny", layers=3, heads=1, head_dim=2, image_tokens=3, text_tokens=1, template_tokens=2)
    assert g.linear_flops(1) == 104
    assert g.layer_cached_flops == 104 * 4 + 4 * 4 * 6 * 2  # 4 request tokens attend to 4 + 2 keys
    assert g.template_layer_flops == 104 * 2 + 4 * 2 * 2 * 2  # template tokens attend only to themselves
    assert g.layer_full_flops == 608 + 240
    p = DeviceProfile("t", "soc", DeviceCompute(100.0, 0.0, layer_overhead_s=0.5), DeviceMemory(0), model=g)
    assert p.layer_cached_s == pytest.approx(6.08 + 0.5)
    assert p.layer_full_s == pytest.approx(8.48 + 0.5)
    assert p.step_cached_s == pytest.approx(3 * 6.58)
    assert p.template_pass_s == pytest.approx(3 * (2.40 + 0.5))


def test_profiles_derive_their_speed_from_the_published_sd15_time():
    # by hand: 0.8 TFLOP per SD 1.5 UNet pass / the published pass time (58 ms, 0.23 s, 4 s, 76 ms, 45 ms)
    want_tflop_s = {
        "snapdragon-8-elite-npu": 13.793,
        "snapdragon-8-elite-gpu": 3.4783,
        "snapdragon-8-elite-cpu": 0.2,
        "snapdragon-8-gen-3-npu": 10.526,
        "snapdragon-8-elite-gen-5-npu": 17.778,
    }
    assert SD15_UNET_FLOPS == 0.8e12
    assert {name: p.effective_flop_per_s / 1e12 for name, p in PROFILES.items()} == pytest.approx(want_tflop_s, 1e-4)
    assert all(src["source"] for src in PROFILE_SOURCES)
    assert "13.79" in sources_table() and "17.78" in sources_table()  # the table the docs print
    npu, gpu, cpu = (PROFILES[f"snapdragon-8-elite-{u}"] for u in ("npu", "gpu", "cpu"))
    assert npu.fixed_s == gpu.fixed_s == 0.225 and cpu.fixed_s == 0.5
    assert npu.npu_session_bytes == int(3.75 * 2**30) and cpu.npu_session_bytes == gpu.npu_session_bytes == 0
    # the old CPU profile was 400x the NPU's step time; the FLOP-derived one is ~70x
    assert 50 < cpu.step_cached_s / npu.step_cached_s < 100


def test_klein_geometries_kv_bytes_and_the_design_rule():
    k = get_geometry("klein4b-512-ref1024")
    assert k.width == 3072 and k.layers == 25 and k.double_layers == 5
    assert k.kv_bytes_fp16 == 25 * 2 * 4096 * 3072 * 2
    assert k.with_fields(template_tokens=1024).kv_bytes_fp16 / 2**20 == pytest.approx(300, rel=0.01)
    assert 2.5 < k.template_tokens / k.request_tokens < 3  # "template ~2.5x the request"
    # FLOPs per fp16 KV byte of a template token-layer = 6.5 d + keys (docs/design.md)
    per_byte = k.template_layer_flops / (k.template_tokens * 4 * k.width)
    assert per_byte == pytest.approx(6.5 * k.width + k.template_tokens)
    assert get_geometry("klein4b-1024-ref1024").image_tokens == 4096
    assert get_profile("snapdragon-8-elite-npu", "klein4b-512-ref1024").model is GEOMETRIES["klein4b-512-ref1024"]


def test_bad_values_name_the_fix():
    with pytest.raises(ValueError, match="effective_flop_per_s must be > 0"):
        DeviceProfile("p", "soc", DeviceCompute(0.0, 0.0), DeviceMemory(0))
    with pytest.raises(ValueError, match="unknown geometry 'x'"):
        get_geometry("x")
    with pytest.raises(ValueError, match="double_layers"):
        DitGeometry.of(layers=2, double_layers=3)


def test_the_records_are_built_from_parts_and_keep_their_flat_published_form():
    k = get_geometry("klein4b-512-ref1024")
    assert k.shape.layers == k.layers and k.tokens.template_tokens == k.template_tokens
    assert list(k.as_dict()) == [  # the e2e JSON's ``model``: the flat keys in the order the committed files hold
        *("name", "layers", "heads", "head_dim", "image_tokens", "template_tokens", "text_tokens", "steps"),
        *("mlp_ratio", "double_layers", "references", "description", "width", "kv_bytes_fp16"),
    ]
    short = k.with_fields(steps=2, template_tokens=1024)
    assert short == DitGeometry(k.name, k.shape, replace(k.tokens, template_tokens=1024), 2, k.description)
    assert DitGeometry.of(**{n: v for n, v in k.as_dict().items() if n not in ("width", "kv_bytes_fp16")}) == k
    with pytest.raises(ValueError, match="no field layerz; its fields are"):
        k.with_fields(layerz=3)
    cpu = PROFILES["snapdragon-8-elite-cpu"]
    q = cpu.with_fields(dit_cpu_cores=0, npu_session_bytes=1, link_mbit_s=5.0)
    assert (q.compute.dit_cpu_cores, q.memory.npu_session_bytes, q.link_mbit_s) == (0, 1, 5.0)
    assert (q.dit_cpu_cores, q.npu_session_bytes, q.fixed_s, q.model) == (0, 1, cpu.fixed_s, cpu.model)
    with pytest.raises(ValueError, match="profile snapdragon-8-elite-cpu: no field layers"):
        cpu.with_fields(layers=3)
