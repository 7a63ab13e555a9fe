"""Token importance: exact recomputation of the processors' attention, determinism, non-uniformity."""

import numpy as np
import torch

from sakura_core.precompute import ProbeConfig, attention_error, capture_attention, estimate_importance
from sakura_core.precompute.importance import importance_from_captures
from sakura_core.precompute.probes import make_probes


def test_captured_attention_equals_what_the_processors_compute(demo_model, demo_kv, demo_template):
    """The hook's recomputed q/k/v give the attention output the diffusers KV processors actually produced."""
    adapter = demo_model.adapter
    seen = {}
    handles = []
    for i, block in enumerate(adapter.model.transformer_blocks):
        handles.append(block.attn.to_out[0].register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0])))
    for j, block in enumerate(adapter.model.single_transformer_blocks):
        i = j + adapter.num_double
        handles.append(block.attn.to_out.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0])))
    try:
        probes = make_probes(demo_model, demo_model.pack_image(demo_template), ProbeConfig(num_probes=2))
        captures = capture_attention(demo_model, demo_kv, probes)
    finally:
        for h in handles:
            h.remove()
    for layer, cap in enumerate(captures):
        out = cap.output(demo_kv.kv[layer, 0], demo_kv.kv[layer, 1]).permute(0, 2, 1, 3).flatten(2)
        got = seen[layer]
        if layer < adapter.num_double:
            out = out[:, cap.n_txt :]  # double blocks project the image part through to_out
        else:
            got = got[..., : out.shape[-1]]  # single blocks: [attention, mlp] go through to_out together
        torch.testing.assert_close(out, got, rtol=1e-5, atol=1e-5)


def test_importance_is_deterministic_given_the_seed(demo_model, demo_kv, demo_template):
    a = estimate_importance(demo_model, demo_kv, demo_template, ProbeConfig(num_probes=3, seed=5, gain_steps=0))
    b = estimate_importance(demo_model, demo_kv, demo_template, ProbeConfig(num_probes=3, seed=5, gain_steps=0))
    c = estimate_importance(demo_model, demo_kv, demo_template, ProbeConfig(num_probes=3, seed=6, gain_steps=0))
    for name in ("mass", "k_weight", "v_weight", "k_drop", "layer_gain"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.mass, c.mass)


def test_importance_is_a_distribution_over_template_tokens_and_not_uniform(demo_model, demo_template):
    # structured template: a flat grey field with one textured square
    img = np.full_like(demo_template, 128)
    img[16:40, 16:40] = demo_template[16:40, 16:40]
    kv = demo_model.adapter.extract_template_kv(demo_model.template_tokens(img), demo_model.spec.grid)
    imp = estimate_importance(demo_model, kv, img, ProbeConfig(num_probes=4, gain_steps=0))
    n_layers, heads, tokens = imp.mass.shape
    assert (n_layers, tokens) == (demo_model.adapter.num_layers, demo_model.spec.num_tokens)
    share = imp.mass.sum(-1)  # mean mass of a query on all template tokens, per layer and head
    assert ((share > 0) & (share < 1)).all()
    np.testing.assert_allclose(share.mean(-1), imp.template_share, rtol=1e-4)
    assert (imp.mass.max(-1) / imp.mass.min(-1) > 1.3).all()  # every layer and head has favourite tokens
    rows, cols = demo_model.spec.grid
    p = demo_model.spec.patch_size
    square = np.zeros((rows, cols), bool)
    square[16 // p : 40 // p, 16 // p : 40 // p] = True
    tex, flat = imp.mass[..., square.reshape(-1)], imp.mass[..., ~square.reshape(-1)]
    # the flat tokens differ only by position; the textured ones by content too: their importance varies far more
    assert (tex.std(-1) / tex.mean(-1)).mean() > 2 * (flat.std(-1) / flat.mean(-1)).mean()
    assert tex.mean() > 1.1 * flat.mean()
    assert (imp.k_weight >= 0).all() and (imp.v_weight >= 0).all() and (imp.k_drop >= 0).all()


def test_weights_predict_the_attention_error_of_small_perturbations(demo_model, demo_kv, demo_template):
    probes = make_probes(demo_model, demo_model.pack_image(demo_template), ProbeConfig(num_probes=4))
    captures = capture_attention(demo_model, demo_kv, probes)
    imp = importance_from_captures(captures, demo_kv)
    gen = torch.Generator().manual_seed(0)
    layer = 3
    k, v = demo_kv.kv[layer, 0], demo_kv.kv[layer, 1]
    noise = torch.randn(k.shape, generator=gen) * 0.01
    predicted = (imp.v_weight[layer] * (noise.numpy() ** 2).sum(-1)).sum() / imp.out_energy[layer]
    measured = attention_error(captures, demo_kv, {layer: (k, v + noise)}) ** 2
    assert 0.7 < measured / predicted < 1.4
    predicted = (imp.k_weight[layer] * noise.numpy() ** 2).sum() / imp.out_energy[layer]
    measured = attention_error(captures, demo_kv, {layer: (k + noise, v)}) ** 2
    assert 0.7 < measured / predicted < 1.4


def test_attention_error_of_the_exact_kv_is_zero(demo_model, demo_kv, demo_template):
    probes = make_probes(demo_model, None, ProbeConfig(num_probes=2), stream=1)
    captures = capture_attention(demo_model, demo_kv, probes)
    exact = {i: (demo_kv.kv[i, 0], demo_kv.kv[i, 1]) for i in range(demo_kv.num_layers)}
    assert attention_error(captures, demo_kv, exact) == 0.0


def test_layer_gains_are_positive_and_deterministic(demo_model, demo_kv, demo_template):
    a = estimate_importance(demo_model, demo_kv, demo_template, ProbeConfig(num_probes=2, seed=1, gain_steps=2))
    b = estimate_importance(demo_model, demo_kv, demo_template, ProbeConfig(num_probes=2, seed=1, gain_steps=2))
    assert a.layer_gain.shape == (demo_kv.num_layers,) and (a.layer_gain > 0).all()
    assert np.array_equal(a.layer_gain, b.layer_gain)
    sliced = a.layers(2, 3)
    assert sliced.mass.shape[0] == 2 and np.array_equal(sliced.layer_gain, a.layer_gain[2:4])
