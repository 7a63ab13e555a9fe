"""The whole SAKURA path on a tiny klein KV pipeline folder: ``sakura precompute --model FOLDER``, the store served
on loopback, fetched with a policy and edited in latent space; fp16 KV gives diffusers' exact-KV edit to fp16 error."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cloud_server.loopback import StoreSource
from sakura_core import edit
from sakura_core.runtime.live_profile import LiveProfile

TID = "klein-tpl"
PROMPT = "swap the face"


@pytest.fixture(scope="module")
def store(tmp_path_factory, klein_folder):
    from sakura_core.cli import main

    root = tmp_path_factory.mktemp("klein-store")
    rc = main(["precompute", "--store", str(root), "--model", str(klein_folder), "--image", "astronaut", "--id", TID])
    assert rc == 0
    return root


def _edit(model, store, policy: str, steps: int = 2):
    opened = asyncio.run(edit.open_template(StoreSource(str(store)), TID, model))
    user = np.asarray(np.random.default_rng(1).integers(0, 256, (80, 96, 3)), np.uint8)  # resized on the device
    settings = edit.EditSettings(PROMPT, steps=steps, seed=4, policy=policy)
    profile = LiveProfile(0.01, 0.005, model.adapter.num_layers, steps)
    outcome = asyncio.run(edit.run_template_edit(model, opened, user, settings, link="fixed:50", profile=profile))
    return opened, user, outcome


def test_precompute_cli_publishes_latent_kv_for_the_folder_model(store, klein_model):
    opened = asyncio.run(edit.open_template(StoreSource(str(store)), TID, klein_model))
    assert opened.model_id == klein_model.model_id and opened.token_grid == klein_model.spec.grid == (4, 4)
    assert opened.manifest["num_layers"] == 3 and opened.manifest["heads"] == 2


@pytest.mark.parametrize("policy", ["sakura", "fetch-fp16", "on-device-cached"])
def test_edit_with_a_policy_runs_and_fp16_kv_matches_exact(store, klein_model, policy):
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.edit import run_edit

    opened, user, outcome = _edit(klein_model, store, policy)
    run = outcome.run
    assert outcome.image.shape == (64, 64, 3) and outcome.image.dtype == np.uint8
    assert not run.fallbacks, run.fallbacks
    size = klein_model.spec.image_size
    template = opened.template_image(size)
    exact_kv = klein_model.adapter.extract_template_kv(klein_model.template_tokens(template), klein_model.spec.grid)
    exact = run_edit(klein_model, load_image(user, size), PROMPT, steps=2, seed=4, kv_source=exact_kv).tokens
    err = float((run.tokens - exact).abs().max())
    if policy == "on-device-cached":
        assert err == 0.0  # the device computed the template itself: exact
    elif policy == "fetch-fp16":
        assert err < 1e-3  # fp16 storage of the KV only
    assert run.bytes_fetched > 0 or policy == "on-device-cached"
