"""Exactness of template KV reuse on a tiny random FLUX.2 KV-mode model (fp32), checked against diffusers itself."""

import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

from sakura_core.models.flux2_kv import REF_TIME_OFFSET, Flux2KVAdapter, image_ids, model_content_id, text_ids
from sakura_core.models.kv_types import KVMismatchError, TemplateKV

GRID = (4, 4)
N = GRID[0] * GRID[1]


def _tiny(seed=0):
    torch.manual_seed(seed)
    return Flux2Transformer2DModel(
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


@pytest.fixture(scope="module")
def adapter():
    return Flux2KVAdapter(_tiny())


def _diffusers_extract(adapter, ref, x, txt, t):
    """A full request through diffusers' own forward in extract mode: (sample, per-layer KV)."""
    ids = torch.cat([image_ids(*GRID, t=REF_TIME_OFFSET), image_ids(*GRID)])
    with torch.no_grad():
        out = adapter.model(
            torch.cat([ref, x], 1),
            txt,
            t,
            img_ids=ids,
            txt_ids=text_ids(txt.shape[1]),
            kv_cache_mode="extract",
            num_ref_tokens=N,
        )
    m = adapter.model
    caches = [out.kv_cache.get_double(i) for i in range(len(m.transformer_blocks))]
    caches += [out.kv_cache.get_single(i) for i in range(len(m.single_transformer_blocks))]
    return out.sample, torch.stack([torch.stack([c.k_ref[0], c.v_ref[0]]) for c in caches])


def _request(seed, n_txt=5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, N, 16, generator=g), torch.randn(1, n_txt, 32, generator=g), torch.rand(1, generator=g))


def test_template_only_kv_equals_kv_of_any_full_request(adapter):
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(7))
    kv = adapter.extract_template_kv(ref, GRID)
    assert kv.kv.shape == (4, 2, N, 2, 16)
    for seed, n_txt in [(1, 5), (2, 9), (3, 1)]:  # other user latents, prompts (lengths), timesteps
        _, full_kv = _diffusers_extract(adapter, ref, *_request(seed, n_txt))
        assert (full_kv - kv.kv).abs().max() <= 1e-6
    # and the KV really depends on the template
    other = adapter.extract_template_kv(ref + 0.5, GRID)
    assert (other.kv - kv.kv).abs().max() > 1e-3


@pytest.mark.parametrize("split_layer", [0, 1, 2, 3, 4])
def test_injected_and_hybrid_forwards_equal_the_full_extract_run(adapter, split_layer):
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(7))
    kv = adapter.extract_template_kv(ref, GRID)
    x, txt, t = _request(11)
    want, _ = _diffusers_extract(adapter, ref, x, txt, t)
    got = adapter.forward(x, txt, t, img_grid=GRID, ref_tokens=ref, ref_grid=GRID, split_layer=split_layer, cached=kv)
    assert (got.sample - want).abs().max() <= 1e-5
    assert len(got.extracted) == split_layer
    # the device-computed layers are the template's KV too
    for layer, (k, v) in enumerate(got.extracted):
        assert (k[0] - kv.kv[layer, 0]).abs().max() <= 1e-6 and (v[0] - kv.kv[layer, 1]).abs().max() <= 1e-6


def test_wrong_kv_changes_the_output(adapter):
    """Guards the test above: if injection were ignored, outputs would not move."""
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(7))
    kv = adapter.extract_template_kv(ref, GRID)
    noisy = TemplateKV(kv.kv + 0.1 * torch.randn_like(kv.kv), kv.model_id, GRID, kv.rope_layout)
    x, txt, t = _request(11)
    a = adapter.forward(x, txt, t, img_grid=GRID, ref_grid=GRID, cached=kv).sample
    b = adapter.forward(x, txt, t, img_grid=GRID, ref_grid=GRID, cached=noisy).sample
    assert (a - b).abs().max() > 1e-4


def test_kv_for_another_model_or_grid_is_refused_naming_both(adapter):
    ref = torch.randn(1, N, 16)
    kv = adapter.extract_template_kv(ref, GRID)
    other = Flux2KVAdapter(_tiny(seed=1))
    assert other.model_id != adapter.model_id
    x, txt, t = _request(3)
    with pytest.raises(KVMismatchError) as e:
        other.forward(x, txt, t, img_grid=GRID, ref_grid=GRID, cached=kv)
    assert kv.model_id[:16] in str(e.value) and other.model_id[:16] in str(e.value)
    with pytest.raises(KVMismatchError, match=r"\(4, 4\).*\(2, 8\)"):
        adapter.check(kv, (2, 8))


def test_model_id_is_a_content_hash():
    a, b = _tiny(0), _tiny(0)
    assert model_content_id(a) == model_content_id(b)
    with torch.no_grad():
        b.proj_out.weight[0, 0] += 1e-3
    assert model_content_id(a) != model_content_id(b)


def test_bad_arguments_are_explained(adapter):
    x, txt, t = _request(3)
    with pytest.raises(ValueError, match="split_layer must be in"):
        adapter.forward(x, txt, t, img_grid=GRID, split_layer=9)
    with pytest.raises(ValueError, match="pass ref_tokens"):
        adapter.forward(x, txt, t, img_grid=GRID, split_layer=2)
    with pytest.raises(ValueError, match="pass cached template KV"):
        adapter.forward(x, txt, t, img_grid=GRID, ref_tokens=x, ref_grid=GRID, split_layer=2)
    with pytest.raises(ValueError, match=r"token_grid \(3, 3\) holds 9 tokens"):
        TemplateKV(torch.zeros(4, 2, 16, 2, 16), "id", (3, 3), "r")
    with pytest.raises(TypeError, match="joint_approx"):
        Flux2KVAdapter(torch.nn.Linear(2, 2))


def test_dynamic_split_decides_per_layer_and_stays_dropped(adapter):
    ref = torch.randn(1, N, 16, generator=torch.Generator().manual_seed(7))
    kv = adapter.extract_template_kv(ref, GRID)
    x, txt, t = _request(11)
    asked = []

    def keep(layer):
        asked.append(layer)
        return layer < 2

    got = adapter.forward(x, txt, t, img_grid=GRID, ref_tokens=ref, ref_grid=GRID, split_layer=keep, cached=kv)
    fixed = adapter.forward(x, txt, t, img_grid=GRID, ref_tokens=ref, ref_grid=GRID, split_layer=2, cached=kv)
    assert asked == [0, 1, 2]  # never asked again once dropped
    assert len(got.extracted) == 2 and torch.equal(got.sample, fixed.sample)
