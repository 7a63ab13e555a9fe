"""``per-step`` KV mode on a tiny random FLUX.2 model (fp32), checked against diffusers' own forward at every step.

The template tokens attend only to themselves and are modulated with the step's own time (diffusers' extract forward
with ``ref_fixed_timestep`` = that step's t), so the KV of step s is request-independent but differs between steps.
"""

import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

from sakura_core.models.flux2_kv import REF_TIME_OFFSET, Flux2KVAdapter, image_ids, text_ids
from sakura_core.models.kv_types import KVMismatchError, PerStepTemplateKV
from sakura_core.runtime.schedule import euler_sample, flow_timesteps

GRID = (4, 4)
N = GRID[0] * GRID[1]
STEPS = 4
TIMES = flow_timesteps(STEPS, shift=3.0)[:-1]  # the times steps 0..3 run at


@pytest.fixture(scope="module")
def adapter():
    torch.manual_seed(0)
    model = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False,
    ).eval()
    return Flux2KVAdapter(model)


@pytest.fixture(scope="module")
def ref():
    return torch.randn(1, N, 16, generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def per_step(adapter, ref):
    return adapter.extract_per_step_kv(ref, GRID, TIMES)


def _diffusers(adapter, ref, x, txt, t: float):
    """One request through diffusers' forward in extract mode with the template at the step's time t."""
    ids = torch.cat([image_ids(*GRID, t=REF_TIME_OFFSET), image_ids(*GRID)])
    with torch.no_grad():
        out = adapter.model(
            torch.cat([ref, x], 1),
            txt,
            torch.full((x.shape[0],), t),
            img_ids=ids,
            txt_ids=text_ids(txt.shape[1]),
            kv_cache_mode="extract",
            num_ref_tokens=N,
            ref_fixed_timestep=t,
        )
    m = adapter.model
    caches = [out.kv_cache.get_double(i) for i in range(len(m.transformer_blocks))]
    caches += [out.kv_cache.get_single(i) for i in range(len(m.single_transformer_blocks))]
    return out.sample, torch.stack([torch.stack([c.k_ref[0], c.v_ref[0]]) for c in caches])


def _request(seed, n_txt=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, N, 16, generator=g), torch.randn(1, n_txt, 32, generator=g)


def test_per_step_kv_equals_diffusers_at_every_step_for_any_request(adapter, ref, per_step):
    assert isinstance(per_step, PerStepTemplateKV) and per_step.kv.shape == (STEPS, 4, 2, N, 2, 16)
    assert per_step.timesteps == tuple(float(t) for t in TIMES)
    for s, t in enumerate(TIMES.tolist()):
        for seed, n_txt in [(1, 5), (2, 9)]:  # other user latents and prompts
            _, full_kv = _diffusers(adapter, ref, *_request(seed, n_txt), t)
            assert (full_kv - per_step.kv[s]).abs().max() <= 1e-6, (s, seed)


def test_kv_of_one_step_is_wrong_for_another(adapter, ref, per_step):
    """Reuse across steps would be wrong: the KV moves with the step's modulation, and the output with it."""
    for s in range(STEPS):
        for s2 in range(s + 1, STEPS):
            assert (per_step.kv[s] - per_step.kv[s2]).abs().max() > 1e-3, (s, s2)
    single = adapter.extract_template_kv(ref, GRID)  # single mode: template at t = 0
    assert (single.kv - per_step.kv[0]).abs().max() > 1e-3
    x, txt = _request(3)
    t = float(TIMES[1])
    with pytest.raises(KVMismatchError, match=r"at t=1 .* at t=0.9;"):
        # step 0's KV (t = 1) injected into step 1 (t = 0.9) is refused, naming both times
        adapter.forward(x, txt, torch.tensor([t]), img_grid=GRID, cached=per_step.at_step(0), ref_timestep=t)
    with pytest.raises(KVMismatchError, match="per-step"):
        adapter.forward(x, txt, torch.tensor([t]), img_grid=GRID, cached=single, ref_timestep=t)


@pytest.mark.parametrize("split_layer", [0, 1, 2, 3, 4])
def test_hybrid_forwards_equal_diffusers_at_every_step(adapter, ref, per_step, split_layer):
    """Layers < k compute the template at the step's time on the device, layers >= k inject that step's KV."""
    x, txt = _request(11)
    for s, t in enumerate(TIMES.tolist()):
        want, _ = _diffusers(adapter, ref, x, txt, t)
        got = adapter.forward(
            x,
            txt,
            torch.tensor([t]),
            img_grid=GRID,
            ref_tokens=ref,
            ref_grid=GRID,
            split_layer=split_layer,
            cached=per_step.at_step(s),
            ref_timestep=t,
        )
        assert (got.sample - want).abs().max() <= 1e-6, (s, split_layer)
        for layer, (k, v) in enumerate(got.extracted):  # device-computed layers are this step's KV too
            assert (k[0] - per_step.kv[s, layer, 0]).abs().max() <= 1e-6
            assert (v[0] - per_step.kv[s, layer, 1]).abs().max() <= 1e-6


def test_a_whole_per_step_edit_with_injected_kv_equals_diffusers(adapter, ref, per_step):
    """Sampling with the fetched KV of each step (split 2 at odd steps, 0 at even) == diffusers every step."""
    _, txt = _request(5)
    noise = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(9))
    times = flow_timesteps(STEPS, shift=3.0)

    def ours(x, t, step):
        k = 2 if step % 2 else 0
        kv = per_step.at_step(step)
        out = adapter.forward(
            x, txt, t, img_grid=GRID, ref_tokens=ref, ref_grid=GRID, split_layer=k, cached=kv, ref_timestep=float(t)
        )
        return out.sample

    def reference(x, t, step):
        return _diffusers(adapter, ref, x, txt, float(t))[0]

    a, b = euler_sample(ours, noise, times), euler_sample(reference, noise, times)
    assert (a - b).abs().max() <= 1e-6


def test_per_step_kv_validation(per_step):
    with pytest.raises(ValueError, match="one per step"):
        PerStepTemplateKV(per_step.kv, "id", GRID, "r", (0.5,))
    with pytest.raises(ValueError, match="steps, layers, 2"):
        PerStepTemplateKV(per_step.kv[0], "id", GRID, "r", (0.5,))
    with pytest.raises(IndexError, match="steps 0..3"):
        per_step.at_step(4)
    assert per_step.at_step(2).ref_timestep == per_step.timesteps[2]


@pytest.mark.parametrize("split_layer", [0, 2, 4])
def test_template_larger_than_the_request_is_exact_in_both_modes(adapter, split_layer):
    """An 8x8 template (4x the request's 4x4 tokens) with its own position ids, single and per-step mode."""
    big = (8, 8)
    n_big = big[0] * big[1]
    ref = torch.randn(1, n_big, 16, generator=torch.Generator().manual_seed(21))
    x, txt = _request(13)
    per_step = adapter.extract_per_step_kv(ref, big, TIMES)
    single = adapter.extract_template_kv(ref, big)
    assert per_step.kv.shape[3] == n_big == 4 * N
    ids = torch.cat([image_ids(*big, t=REF_TIME_OFFSET), image_ids(*GRID)])
    for s, t in enumerate(TIMES.tolist()):
        for ref_t, kv in ((t, per_step.at_step(s)), (0.0, single)):
            with torch.no_grad():
                want = adapter.model(
                    torch.cat([ref, x], 1),
                    txt,
                    torch.tensor([t]),
                    img_ids=ids,
                    txt_ids=text_ids(txt.shape[1]),
                    kv_cache_mode="extract",
                    num_ref_tokens=n_big,
                    ref_fixed_timestep=ref_t,
                )
            got = adapter.forward(
                x,
                txt,
                torch.tensor([t]),
                img_grid=GRID,
                ref_tokens=ref,
                ref_grid=big,
                split_layer=split_layer,
                cached=kv,
                ref_timestep=ref_t,
            )
            assert (got.sample - want.sample).abs().max() <= 1e-6, (s, ref_t)
            k0 = want.kv_cache.get_double(0).k_ref[0]
            assert (k0 - kv.kv[0, 0]).abs().max() <= 1e-6
