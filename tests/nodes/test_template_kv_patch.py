"""The parts of the Sakura Template KV MODEL patch that need no real ComfyUI (the stand-in API): the Template KV
Loader without a model (ComfyUI's own klein: the patch checks the template), the reference tokens dropped only when
they are the template's, and the compute mode's mask (reference queries on reference keys only). The patch on ComfyUI
0.29's own forward: ``test_comfyui29_klein.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sakura_core.fetch.sources import StoreSource


@pytest.mark.slow  # the session's example store
def test_loader_without_a_model_hands_on_the_unchecked_manifest(flow, store_dir):
    template = flow.load_template(None, source="local store", store_dir=str(store_dir))
    assert template.manifest is not None and template.model_id == template.manifest.model_id


def test_patch_refuses_a_handle_without_manifest(comfy, node_classes, run_node):
    handle = comfy.nodes._stream.TemplateHandle("x", "m", StoreSource("/nowhere"))
    with pytest.raises(comfy.nodes._common.SakuraNodeError, match="connect a Sakura Template KV Loader"):
        run_node(
            node_classes["SakuraTemplateKV"],
            model=object(),
            template=handle,
            kv_source="fetched template",
            representation="fp16",
        )


def test_reference_tokens_are_dropped_only_when_they_are_the_templates(comfy):
    patches = comfy.nodes._kv_patches
    state = patches.RunState(SimpleNamespace(template_id="tk", kv_mode="single"), "fp16", None, 2, 5)
    state.sigmas = [1.0, 0.5, 0.0]
    drop = patches.DropReferences(state, template_tokens=16)
    img, ids, sigma = torch.randn(1, 16 + 16, 8), torch.zeros(1, 32, 4), torch.tensor([1.0])
    opts = {"reference_image_num_tokens": [16], "sigmas": sigma}
    out = drop({"img": img, "img_ids": ids, "transformer_options": opts})
    assert torch.equal(out["img"], img[:, :16]) and out["img_ids"].shape == (1, 16, 4)
    same = drop({"img": img, "img_ids": ids, "transformer_options": {"sigmas": sigma}})
    assert same["img"] is img  # no ReferenceLatent: the template is the reference
    with pytest.raises(comfy.nodes._common.SakuraNodeError, match="make 20 tokens, template 'tk' holds 16"):
        drop(
            {"img": img, "img_ids": ids, "transformer_options": {"reference_image_num_tokens": [20], "sigmas": sigma}}
        )
    state.carry = True  # a policy's split: step 0 keeps them in the sequence, later steps drop them
    assert drop({"img": img, "img_ids": ids, "transformer_options": opts})["img"] is img and state.refs_now == 16
    opts["sigmas"] = torch.tensor([0.5])
    assert drop({"img": img, "img_ids": ids, "transformer_options": opts})["img"].shape[1] == 16


def test_compute_mode_keeps_reference_queries_on_reference_keys(comfy):
    patch = comfy.nodes._kv_patches
    q = k = v = torch.randn(1, 2, 10, 4)  # (B, H, L, D): 6 text/image tokens, then 4 reference tokens
    mask = patch.SelfOnlyReferences()(q, k, v, extra_options={"reference_image_num_tokens": [4]})["attn_mask"]
    weights = torch.softmax(q @ k.transpose(-1, -2) / 2 + mask, dim=-1)
    assert torch.all(weights[..., 6:, :6] == 0)  # references see only references
    assert torch.all(weights[..., :6, 6:] > 0)  # the request sees them
    assert patch.SelfOnlyReferences()(q, k, v, extra_options={}) == {}
