"""The embedded demo model: token packing, deterministic prompts, exact edits through every KV path."""

import numpy as np
import pytest
import torch

from sakura_core.models.edit_model import load_demo_model, load_image
from sakura_core.runtime.denoise import run_edit


@pytest.fixture(scope="module")
def model():
    return load_demo_model()


def test_pack_unpack_round_trips_pixels(model):
    img = load_image("astronaut", model.spec.image_size)
    tokens = model.pack_image(img)
    assert tokens.shape == (1, model.spec.num_tokens, model.spec.patch_dim)
    assert np.array_equal(model.unpack_tokens(tokens), img)
    # token 1 is the patch right of token 0 (row-major)
    p = model.spec.patch_size
    patch1 = img[:p, p : 2 * p].astype(np.float32) / 127.5 - 1
    assert torch.allclose(tokens[0, 1].reshape(p, p, 3), torch.from_numpy(patch1))


def test_prompt_embedding_is_deterministic_and_prompt_dependent(model):
    a, b = model.encode_prompt("red hat"), model.encode_prompt("red hat")
    assert torch.equal(a, b)
    assert not torch.equal(a, model.encode_prompt("blue hat"))
    assert torch.count_nonzero(a[0, 7:]) == 0  # padding beyond the 7 bytes


def test_load_image_rejects_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_image(tmp_path / "nope.png", 64)


def test_edit_with_fetched_kv_equals_the_on_device_edit(model):
    size, L = model.spec.image_size, model.adapter.num_layers
    tpl, usr = load_image("astronaut", size), load_image("chelsea", size)
    kv = model.adapter.extract_template_kv(model.template_tokens(tpl), model.spec.grid)
    full = run_edit(model, usr, "x", steps=3, split_layer=L, template_image=tpl, template_every_step=True)
    fetched = run_edit(model, usr, "x", steps=3, kv_source=kv)
    hybrid = run_edit(model, usr, "x", steps=3, split_layer=L // 2, template_image=tpl, kv_source=kv)
    assert (fetched.tokens - full.tokens).abs().max() <= 1e-5
    assert (hybrid.tokens - full.tokens).abs().max() <= 1e-5
    assert len(hybrid.device_kv) == L // 2
    # another template gives another edit
    other = model.adapter.extract_template_kv(model.template_tokens(load_image("coffee", size)), model.spec.grid)
    assert (run_edit(model, usr, "x", steps=3, kv_source=other).tokens - full.tokens).abs().max() > 1e-3
