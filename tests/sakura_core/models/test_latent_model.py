"""The latent klein edit equals diffusers' own Flux2KleinKVPipeline on a tiny random folder (save_pretrained)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ci_deps import import_or_skip

import_or_skip("transformers", "the klein text encoder needs transformers (pip install transformers)")


@pytest.fixture(scope="module")
def klein(klein_folder, klein_model):
    torch.set_num_threads(1)
    return klein_folder, klein_model


def _images(size: int, template_size: int | None = None):
    rng = np.random.default_rng(7)
    t = template_size or size
    template = (rng.random((t, t, 3)) * 255).astype(np.uint8)
    yy, xx = np.mgrid[0:size, 0:size]
    user = np.stack([xx * 4 % 256, yy * 4 % 256, (xx + yy) * 2 % 256], axis=-1).astype(np.uint8)
    return template, user


def _diffusers_output(model, template, user, prompt, steps, seed):
    """diffusers' pipeline on the same inputs: the template as its reference image, our start latents."""
    from PIL import Image

    pipe = model.pipe
    u = model.pack_image(user)
    noise = torch.randn(u.shape, generator=torch.Generator().manual_seed(seed))
    start, _ = model.edit_start(u, noise, steps)
    rows, cols = model.spec.grid
    latents = start.permute(0, 2, 1).reshape(1, -1, rows, cols)  # (1, 4C, rows, cols) as prepare_latents takes
    out = pipe(
        image=Image.fromarray(template),
        prompt=prompt,
        num_inference_steps=steps,
        height=model.spec.image_size,
        width=model.spec.image_size,
        sigmas=model.sigmas_in(steps),
        latents=latents,
        output_type="np",
        max_sequence_length=model.spec.text_tokens,
        text_encoder_out_layers=model.spec.text_encoder_layers,
    )
    return out.images[0]


@pytest.mark.parametrize(("split_layer", "template_size"), [(0, 64), (2, 64), (0, 128), (1, 128)])
def test_latent_edit_with_fetched_kv_equals_diffusers(klein, split_layer, template_size):
    """Fetched KV (split 0), or a hybrid split; a 128 px template (8x8 latent grid) on a 64 px edit too."""
    from sakura_core.runtime.denoise import run_edit

    _, model = klein
    size, steps, seed, prompt = model.spec.image_size, 3, 5, "swap the face"
    template, user = _images(size, template_size)
    kv = model.adapter.extract_template_kv(model.template_tokens(template), model.template_grid(template))
    ours = run_edit(
        model, user, prompt, steps=steps, seed=seed, kv_source=kv, split_layer=split_layer, template_image=template
    )
    theirs = _diffusers_output(model, template, user, prompt, steps, seed)
    diff = float(np.abs(model.decode_float(ours.tokens) - theirs).max())
    print(f"split {split_layer}, template {template_size} px: max |ours - diffusers| = {diff:.3e} (images in [0, 1])")  # noqa: T201 (-s figure)
    assert diff <= 1e-5
    assert np.abs(theirs - theirs.mean()).max() > 1e-3  # a real image, not a constant
    other = model.adapter.extract_template_kv(
        model.template_tokens(np.ascontiguousarray(template[::-1])), model.template_grid(template)
    )  # another template
    wrong = run_edit(model, user, prompt, steps=steps, seed=seed, kv_source=other).tokens
    assert np.abs(model.decode_float(wrong) - theirs).max() > 1e-4  # the comparison can tell KV apart


def test_user_image_and_prompt_change_the_edit_template_kv_does_not_depend_on_them(klein):
    from sakura_core.runtime.denoise import run_edit

    _, model = klein
    template, user = _images(model.spec.image_size)
    kv = model.adapter.extract_template_kv(model.template_tokens(template), model.spec.grid)
    base = run_edit(model, user, "a", steps=2, kv_source=kv).tokens
    other_user = run_edit(model, user[::-1].copy(), "a", steps=2, kv_source=kv).tokens
    other_prompt = run_edit(model, user, "b completely different", steps=2, kv_source=kv).tokens
    assert (base - other_user).abs().max() > 1e-4 and (base - other_prompt).abs().max() > 1e-4
    # the KV is a function of the template alone: a fresh extract is bit-identical
    again = model.adapter.extract_template_kv(model.template_tokens(template), model.spec.grid)
    assert torch.equal(again.kv, kv.kv)


def test_folder_detection_and_spec_errors(klein, tmp_path):
    from sakura_core.models.latent_model import LatentSpec, load_klein_folder
    from sakura_core.models.loading import is_klein_folder

    folder, model = klein
    assert is_klein_folder(folder) and not is_klein_folder(tmp_path)
    assert model.adapter.model.config.in_channels == 16 and model.spec.grid == (4, 4)
    with pytest.raises(ValueError, match="model_index.json must name"):
        load_klein_folder(tmp_path)
    with pytest.raises(ValueError, match="multiple of 16"):
        LatentSpec(image_size=72)
    with pytest.raises(ValueError, match="strength"):
        LatentSpec(strength=0.0)
    with pytest.raises(ValueError, match=r"must be \(64, 64, 3\) uint8"):
        model.pack_image(np.zeros((32, 32, 3), np.uint8))
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == "Flux2KleinKVPipeline"
