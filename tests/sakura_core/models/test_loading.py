"""``load_edit_model(..., device=, dtype=)``: the demo model in bfloat16 on the CPU is another model (its id), computes
KV within bfloat16's error of the float32 KV, and precomputes a publishable template; bad devices and dtypes are
refused with the values to use. (CUDA itself needs a GPU machine: not exercised here.)"""

import numpy as np
import pytest
import torch

from sakura_core.models.edit_model import load_image
from sakura_core.models.loading import check_device_dtype, load_edit_model, torch_device


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return load_edit_model("demo"), load_edit_model("demo", dtype="bf16")


def test_bfloat16_is_another_model_with_kv_close_to_float32(models):
    fp32, bf16 = models
    assert fp32.adapter.dtype == torch.float32 and bf16.adapter.dtype == torch.bfloat16
    assert fp32.model_id != bf16.model_id  # the dtype is part of the weights, so of the id
    assert load_edit_model("demo", dtype="float32").model_id == fp32.model_id  # explicit float32 = the default
    image = load_image("astronaut", fp32.spec.image_size)
    ref = fp32.template_tokens(image)
    grid = fp32.template_grid(image)
    kv32 = fp32.adapter.extract_template_kv(ref, grid).kv.float()  # (layers, 2, tokens, heads, head_dim)
    kv16 = bf16.adapter.extract_template_kv(ref, grid).kv.float()
    assert kv16.shape == kv32.shape
    rel = float((kv16 - kv32).norm() / kv32.norm())
    # bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2 % per value); through a dozen layers the error
    # compounds to about 1 %: a 3 % bound still fails for a wrong pass (an error of order 1).
    assert 0 < rel < 0.03, rel


def test_bfloat16_precompute_publishes_a_template_that_says_how_it_was_made(models, tmp_path):
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.kv import parse_manifest

    _, bf16 = models
    store = LocalStore(tmp_path / "s")
    image = load_image("coffee", bf16.spec.image_size)
    result = publish_template(store, bf16, image, "tpl-bf16")
    manifest = store.get_manifest("tpl-bf16")
    parse_manifest(manifest, template_id="tpl-bf16", model_id=bf16.model_id)
    assert manifest["precompute"] == {"device": "cpu", "dtype": "bfloat16"}
    assert result.shards == sum(len(s["representations"]) for s in manifest["shards"])
    psnr = [r.get("psnr_db") for r in manifest["shards"][0]["representations"]]
    assert all(p is not None and np.isfinite(p) for p in psnr)


@pytest.mark.parametrize(
    "device, dtype, message",
    [
        ("gpu", None, "unknown device 'gpu'"),
        ("cuda:x", None, "unknown device"),
        ("cpu", "int8", "unknown dtype 'int8'"),
    ],
)
def test_bad_device_or_dtype_names_the_accepted_values(device, dtype, message):
    with pytest.raises(ValueError, match=message):
        check_device_dtype(device, dtype)
    with pytest.raises(ValueError, match=message):
        load_edit_model("demo", device=device, dtype=dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to refuse")
def test_cuda_without_a_gpu_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="CUDA is not available here.*use --device cpu"):
        torch_device("cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        load_edit_model("demo", device="cuda:0")
