"""Memory admission: the estimate with hand-derived numbers, and who fits in one NPU session."""

import pytest

from android_bridge.budget import DiTGeometry, OverBudgetError, check_budget, estimate_job_memory
from sakura_core.runtime.profiles import PROFILES, DeviceCompute, DeviceMemory, DeviceProfile

NPU, CPU = PROFILES["snapdragon-8-elite-npu"], PROFILES["snapdragon-8-elite-cpu"]
MIB = 2**20


def test_estimate_matches_a_hand_computation():
    g = DiTGeometry(
        "toy",
        params=1000,
        layers=2,
        heads=2,
        head_dim=4,
        image_tokens=6,
        template_tokens=5,
        text_tokens=2,
        mlp_ratio=3.0,
    )
    mem = estimate_job_memory(g, NPU)
    # D = 8, S = 8, S_kv = 13: values = 2*8*8 + 3*8*8 + 2*8*13 + 2*3*8*8 + 8*8 = 128+192+208+384+64 = 976
    assert mem.weights_bytes == 1000 * 1  # w8 on the NPU
    assert mem.kv_bytes == 2 * 2 * 5 * 8 * 2  # layers * (K, V) * tokens * D * 2 bytes = 320
    assert mem.activation_bytes == 976 * 2
    assert mem.total_bytes == 1000 + 320 + 1952 and mem.fits
    assert mem.budget_bytes == int(3.75 * 2**30) and "NPU session" in mem.budget_source
    cpu = estimate_job_memory(g, CPU)
    assert cpu.weights_bytes == 2000 and cpu.budget_bytes == 4 * 2**30 and "app memory" in cpu.budget_source


def test_phone_class_dit_fits_and_a_9b_model_does_not():
    phone = DiTGeometry(
        "phone-dit",
        params=400_000_000,
        layers=24,
        heads=16,
        head_dim=64,
        image_tokens=1024,
        template_tokens=1024,
        text_tokens=128,
    )
    mem = check_budget(phone, NPU)
    assert mem.kv_bytes == 96 * MIB  # docs/design.md: 96 MiB of fp16 template KV for the phone-class DiT
    klein_9b = DiTGeometry(
        "flux2-klein-9b",
        params=9_000_000_000,
        layers=32,
        heads=32,
        head_dim=128,
        image_tokens=1024,
        template_tokens=1024,
        text_tokens=512,
    )
    with pytest.raises(OverBudgetError, match=r"over the budget of 3840\.0 MiB .*one NPU session") as e:
        check_budget(klein_9b, NPU)
    assert e.value.memory.weights_bytes == 9_000_000_000 and not e.value.memory.fits


def test_override_budget_and_the_demo_geometry(demo_model):
    g = DiTGeometry.of_demo(demo_model)
    assert g.layers == demo_model.adapter.num_layers and g.image_tokens == demo_model.spec.num_tokens
    assert g.params == sum(p.numel() for p in demo_model.adapter.model.parameters())
    assert check_budget(g, NPU).fits
    with pytest.raises(OverBudgetError, match="configured memory budget"):
        check_budget(g, NPU, budget_bytes=1024)
    with pytest.raises(ValueError, match="budget_bytes"):
        estimate_job_memory(g, NPU, budget_bytes=0)


def test_invalid_geometry_and_profile_values_are_named():
    with pytest.raises(ValueError, match="layers"):
        DiTGeometry("x", params=1, layers=0, heads=1, head_dim=1, image_tokens=1, template_tokens=0, text_tokens=0)
    with pytest.raises(ValueError, match="host_budget_bytes"):
        DeviceProfile("p", "soc", DeviceCompute(0.1, 0.0), DeviceMemory(0, host_budget_bytes=0))
    with pytest.raises(ValueError, match="weight_bytes_per_param"):
        DeviceProfile("p", "soc", DeviceCompute(0.1, 0.0), DeviceMemory(0, weight_bytes_per_param=0))
    assert NPU.has_npu and NPU.memory_budget_bytes == NPU.npu_session_bytes
    assert not CPU.has_npu and CPU.memory_budget_bytes == CPU.host_budget_bytes
