"""Templates of several reference images (try-on: person + garment): the KV our template-only pass computes over two
references is bit-identical to what diffusers' ``Flux2KleinKVPipeline`` extracts with the same list of images, and
edits with it (fetched everywhere, hybrid, on the device) equal the pipeline's output exactly; the references attend
to each other, in order; the layout agrees with the simulator's multi-reference geometry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ci_deps import import_or_skip

import_or_skip("transformers", "the klein text encoder needs transformers (pip install transformers)")

PROMPT = "put the garment on the person"


def _images(n: int, side: int, seed: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.random((side, side, 3)) * 255).astype(np.uint8) for _ in range(n)]


def _diffusers_run(model, refs, user, steps, seed):
    """diffusers' pipeline with the list of reference images and our start latents: (its step-0 KV per layer, its
    output image)."""
    from PIL import Image

    pipe, transformer = model.pipe, model.pipe.transformer
    nd, ns = len(transformer.transformer_blocks), len(transformer.single_transformer_blocks)
    captured = []
    forward = transformer.forward

    def spy(*args, **kwargs):  # the pipeline clears its cache when done: keep a copy of step 0's
        out = forward(*args, **kwargs)
        if kwargs.get("kv_cache_mode") == "extract":
            cache = out[1]
            captured.extend(
                tuple(t.clone() for t in (cache.get_double(i) if i < nd else cache.get_single(i - nd)).get())
                for i in range(nd + ns)
            )
        return out

    u = model.pack_image(user)
    noise = torch.randn(u.shape, generator=torch.Generator().manual_seed(seed))
    start, _ = model.edit_start(u, noise, steps)
    rows, cols = model.spec.grid
    transformer.forward = spy
    try:
        out = pipe(
            image=[Image.fromarray(r) for r in refs],
            prompt=PROMPT,
            num_inference_steps=steps,
            height=model.spec.image_size,
            width=model.spec.image_size,
            sigmas=model.sigmas_in(steps),
            latents=start.permute(0, 2, 1).reshape(1, -1, rows, cols),
            output_type="np",
            max_sequence_length=model.spec.text_tokens,
            text_encoder_out_layers=model.spec.text_encoder_layers,
        ).images[0]
    finally:
        del transformer.forward  # back to the class's method
    return captured, out


@pytest.mark.parametrize("side", [64, 128])
def test_two_reference_kv_and_edits_equal_diffusers_exactly(klein_model, side):
    from sakura_core.runtime.denoise import run_edit

    model, steps, seed = klein_model, 3, 5
    torch.set_num_threads(1)
    refs = _images(2, side)
    user = _images(1, model.spec.image_size, seed=8)[0]
    theirs_kv, theirs = _diffusers_run(model, refs, user, steps, seed)
    grids = model.template_grid(refs)
    g = side // 16
    assert grids == ((g, g), (g, g))
    kv = model.adapter.extract_template_kv(model.template_tokens(refs), grids)
    assert kv.token_grid == (2 * g, g) and kv.rope_layout == "flux2-ref-t10-x2" and kv.ref_grids == grids
    kv_diff = max(
        float((kv.layer(i)[j] - theirs_kv[i][j][:1]).abs().max()) for i in range(len(theirs_kv)) for j in (0, 1)
    )
    diffs = {}
    for split in (0, 1, model.adapter.num_layers):  # fetched everywhere, hybrid, all on the device
        ours = run_edit(
            model, user, PROMPT, steps=steps, seed=seed, kv_source=kv, split_layer=split, template_image=refs
        )
        diffs[split] = float(np.abs(model.decode_float(ours.tokens) - theirs).max())
    print(f"{side} px x2: max |KV - diffusers KV| {kv_diff}; edit vs diffusers by split {diffs}")  # noqa: T201
    assert kv_diff == 0.0 and all(d == 0.0 for d in diffs.values())
    assert np.abs(theirs - theirs.mean()).max() > 1e-3  # a real image
    one = run_edit(
        model,
        user,
        PROMPT,
        steps=steps,
        seed=seed,
        kv_source=model.adapter.extract_template_kv(model.template_tokens(refs[0]), grids[0]),
    )
    assert np.abs(model.decode_float(one.tokens) - theirs).max() > 1e-4  # the second reference matters


def test_references_attend_to_each_other_in_order(klein_model):
    """Reference 1 alone and inside the pair: the same first-layer keys and values (its tokens and positions are the
    same), different ones after (it attends to reference 2 too). Reference 2 sits at RoPE time 20: its keys differ
    from the same image alone (time 10), its values do not (no RoPE on values). Swapping the order changes it all."""
    model = klein_model
    a, b = _images(2, 64)
    pair = model.adapter.extract_template_kv(model.template_tokens([a, b]), model.template_grid([a, b])).kv
    alone_a = model.adapter.extract_template_kv(model.template_tokens(a), (4, 4)).kv
    alone_b = model.adapter.extract_template_kv(model.template_tokens(b), (4, 4)).kv
    n = 16  # tokens per reference; kv: (layers, 2, tokens, heads, head_dim)
    assert torch.equal(pair[0, :, :n], alone_a[0]) and not torch.equal(pair[1, :, :n], alone_a[1])
    assert torch.equal(pair[0, 1, n:], alone_b[0, 1]) and not torch.equal(pair[0, 0, n:], alone_b[0, 0])
    swapped = model.adapter.extract_template_kv(model.template_tokens([b, a]), model.template_grid([b, a])).kv
    assert not torch.equal(swapped[:, :, :n], pair[:, :, n:])


def test_the_demo_model_takes_several_references(demo_model):
    """The pixel-patch demo model is the same KV-mode transformer: a two-reference template computes, and its fetched
    KV edits exactly as the on-device template pass (it was trained on one reference: the edit is not meaningful)."""
    from sakura_core.runtime.denoise import run_edit

    m = demo_model
    refs = _images(2, m.spec.image_size)
    kv = m.adapter.extract_template_kv(m.template_tokens(refs), m.template_grid(refs))
    assert kv.num_tokens == 2 * m.spec.num_tokens and kv.rope_layout == "flux2-ref-t10-x2"
    user = _images(1, m.spec.image_size, seed=9)[0]
    fetched = run_edit(m, user, "place it", steps=2, kv_source=kv, template_image=refs).tokens
    device = run_edit(
        m, user, "place it", steps=2, kv_source=kv, split_layer=m.adapter.num_layers, template_image=refs
    ).tokens
    assert torch.equal(fetched, device)


def test_layout_errors_and_wire_form(klein_model):
    from sakura_core.models.kv_types import KVMismatchError
    from sakura_core.models.ref_layout import grids_of, rope_layout_of, stacked_grid

    assert grids_of((8, 4), "flux2-ref-t10-x2") == ((4, 4), (4, 4)) and grids_of((4, 4), "flux2-ref-t10") == ((4, 4),)
    assert rope_layout_of((4, 4)) == "flux2-ref-t10" and stacked_grid(((4, 4),) * 3) == (12, 4)
    with pytest.raises(ValueError, match="share one token grid"):
        klein_model.template_grid(_images(1, 64) + _images(1, 128))
    with pytest.raises(ValueError, match="1..4 reference images"):
        klein_model.template_grid(_images(5, 64))
    with pytest.raises(ValueError, match="do not stack 2 equal references"):
        grids_of((5, 4), "flux2-ref-t10-x2")
    refs = _images(2, 64)
    kv = klein_model.adapter.extract_template_kv(klein_model.template_tokens(refs), klein_model.template_grid(refs))
    with pytest.raises(KVMismatchError, match="RoPE layout"):  # two references' KV is not one reference's
        klein_model.adapter.check(kv, (8, 4))


def test_token_counts_agree_with_the_simulators_geometry(klein_model):
    """Two 1024^2 references on a 512^2 edit, as a latent klein model lays them out (VAE scale 8, 2x2 packing: the
    tiny folder's and klein's), are the token counts the simulator's multi-reference geometry uses."""
    from sakura_core.runtime.geometry import GEOMETRIES

    assert klein_model.spec.vae_scale_factor == 8  # as FLUX.2 [klein]'s VAE
    blank = [np.zeros((1024, 1024, 3), np.uint8)] * 2
    grids = klein_model.template_grid(blank)  # from the image sizes alone (nothing is encoded)
    edit = klein_model.template_grid(np.zeros((512, 512, 3), np.uint8))
    template_tokens = sum(r * c for r, c in grids)
    two = GEOMETRIES["klein4b-512-2ref1024"]  # issue 25's geometry
    assert (two.image_tokens, two.template_tokens, two.references) == (edit[0] * edit[1], template_tokens, 2)
    one = GEOMETRIES["klein4b-512-ref1024"]
    assert (one.image_tokens, 2 * one.template_tokens) == (edit[0] * edit[1], template_tokens)
