"""The approximate path for joint-attention models: exact on the calibration request, bounded error elsewhere."""

import pytest
import torch
from diffusers.models.transformers.transformer_flux import FluxTransformer2DModel

from sakura_core.models.joint_approx import APPROXIMATE, JointRefKVState, apply_joint_ref_kv
from sakura_core.runtime.schedule import flow_timesteps

N_IMG, N_REF, N_TXT, STEPS = 16, 16, 6, 4


def _ids(n, t):
    ids = torch.zeros(n, 3)
    ids[:, 0] = t
    ids[:, 1] = torch.arange(n) // 4
    ids[:, 2] = torch.arange(n) % 4
    return ids


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        axes_dims_rope=(4, 6, 6),
        guidance_embeds=False,
    ).eval()


def _sample(model, state, x, txt, pooled, ref, mode):
    """Euler sampling; ``ref`` is in the sequence unless mode == 'inject'."""
    img_ids, ref_ids, txt_ids = _ids(N_IMG, 0), _ids(N_REF, 1), torch.zeros(N_TXT, 3)
    ts = flow_timesteps(STEPS)
    for step in range(STEPS):
        state.mode, state.step, state.num_ref_tokens = mode, step, N_REF
        if mode == "inject":
            hs, ids = x, img_ids
        else:
            hs, ids = torch.cat([x, ref], 1), torch.cat([img_ids, ref_ids])
        with torch.no_grad():
            v = model(hs, txt, pooled, ts[step].expand(1), ids, txt_ids, return_dict=False)[0][:, :N_IMG]
        x = x + (ts[step + 1] - ts[step]) * v
    return x


def test_joint_reuse_is_exact_for_the_calibration_request_and_approximate_for_others(model):
    assert APPROXIMATE
    gen = torch.Generator().manual_seed(1)
    ref = torch.randn(1, N_REF, 16, generator=gen)
    xa, xb = torch.randn(1, N_IMG, 16, generator=gen), torch.randn(1, N_IMG, 16, generator=gen)
    ta, tb = torch.randn(1, N_TXT, 32, generator=gen), torch.randn(1, N_TXT, 32, generator=gen)
    pa, pb = torch.randn(1, 16, generator=gen), torch.randn(1, 16, generator=gen)
    state = JointRefKVState()
    apply_joint_ref_kv(model, state)

    full_a = _sample(model, state, xa, ta, pa, ref, "capture")  # calibration run records per-step KV
    assert len(state.store) == 3 * STEPS
    inj_a = _sample(model, state, xa, ta, pa, ref, "inject")
    assert (inj_a - full_a).abs().max() <= 1e-5  # same request: the recorded KV is exactly what it computes

    full_b = _sample(model, state, xb, tb, pb, ref, "off")
    inj_b = _sample(model, state, xb, tb, pb, ref, "inject")
    rel = float((inj_b - full_b).norm() / full_b.norm())
    # Measured 7.1e-4 relative error on this tiny random model (seed 0): reuse across requests is not exact.
    assert 1e-5 < rel < 1e-2, rel


def test_missing_calibration_step_is_a_clear_error(model):
    state = JointRefKVState(mode="inject")
    apply_joint_ref_kv(model, state)
    with pytest.raises(KeyError, match="no calibrated reference KV for layer 0 step 0"):
        _sample(model, state, torch.zeros(1, N_IMG, 16), torch.zeros(1, N_TXT, 32), torch.zeros(1, 16), None, "inject")
