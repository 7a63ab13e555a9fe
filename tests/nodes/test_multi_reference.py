"""A template of two reference images through the nodes (stand-in API): the Template KV Loader lists both (name,
size, token grid, tokens), the sampler edits with their fetched KV as it does computing both on the device, and the
two-reference workflow the tests build (``workflows.TEST_WORKFLOWS``: the same graph as the shipped examples) runs
node by node as ComfyUI runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def pair_store(tmp_path_factory, demo_model, workflow_defs):
    root = tmp_path_factory.mktemp("pair-store")
    workflow_defs.publish_two_references(root, demo_model)
    return root


@pytest.fixture(scope="module")
def tid(workflow_defs):
    return workflow_defs.TWO_REFERENCES[0]


def test_the_loader_lists_the_references(comfy, node_classes, demo_model, pair_store, tid):
    loader = node_classes["SakuraTemplateLoader"].PREPARE_CLASS_CLONE({comfy.io.Hidden.unique_id: "2"})
    out = loader.execute(
        model=demo_model, template_id=tid, source="local store", server_url="", token="", store_dir=str(pair_store)
    )
    text = out.ui["text"]
    assert "references: 2 (512 tokens, attending to each other), 6 layers" in text
    assert "  1. person: 64 px, 16x16 = 256 tokens" in text and "  2. garment: 64 px, 16x16 = 256 tokens" in text


def test_fetched_kv_of_two_references_edits_as_computing_them(flow, demo_model, pair_store, user, tid):
    template = flow.load_template(demo_model, template_id=tid, source="local store", store_dir=str(pair_store))
    images = {}
    for policy in ("fetch-fp16", "on-device-cached"):
        stream = flow.make_stream(template, policy=policy, bandwidth="fixed Mbit/s", mbit=100.0)
        image, report_json, _ = flow.sample(demo_model, stream, user, steps=2, seed=1)
        report = json.loads(report_json)
        assert [r["name"] for r in report["template"]["references"]] == ["person", "garment"]
        images[policy] = image.numpy()
    err = float(np.abs(images["fetch-fp16"] - images["on-device-cached"]).max())
    assert err <= 2 / 255 + 1e-6  # fp16 storage of the KV: at most 2 levels of the 8-bit image


def _run_api(workflow: dict, node_classes, comfy, images: dict) -> dict:
    """Run an API-format workflow node by node, each after the nodes it reads (as ComfyUI's executor): a Sakura node
    through ``execute`` (a clone with its hidden unique id), ``LoadImage`` as ``images[file]``, ``ImageScaleBy`` (only
    nearest-exact here) by torch, an output node (``SaveImage``, ``PreviewImage``, ``PreviewAny``) as what it receives.
    Returns ``{node id: NodeOutput or the output node's input}``."""
    import torch

    done: dict = {}

    def value(v):
        return done[v[0]].args[v[1]] if isinstance(v, list) else v

    while len(done) < len(workflow):
        ready = [
            k
            for k, n in workflow.items()
            if k not in done and all(v[0] in done for v in n["inputs"].values() if isinstance(v, list))
        ]
        assert ready, f"a cycle among {sorted(set(workflow) - set(done))}"
        for key in ready:
            node = workflow[key]
            inputs = {name: value(v) for name, v in node["inputs"].items()}
            if node["class_type"] == "LoadImage":
                done[key] = comfy.io.NodeOutput(images[inputs["image"]], None)
            elif node["class_type"] == "ImageScaleBy":
                assert inputs["upscale_method"] == "nearest-exact", inputs["upscale_method"]
                nchw = inputs["image"].movedim(-1, 1)  # (batch, 3, H, W)
                scaled = torch.nn.functional.interpolate(nchw, scale_factor=inputs["scale_by"], mode="nearest-exact")
                done[key] = comfy.io.NodeOutput(scaled.movedim(1, -1))
            elif node["class_type"] in ("SaveImage", "PreviewImage", "PreviewAny"):
                done[key] = next(iter(inputs.values()))
            else:
                clone = node_classes[node["class_type"]].PREPARE_CLASS_CLONE({comfy.io.Hidden.unique_id: key})
                done[key] = clone.execute(**inputs)
    return done


@pytest.mark.slow
def test_the_two_reference_workflow_runs_through_the_nodes(
    comfy, node_classes, workflow_defs, demo_model, pair_store, examples, tmp_path, monkeypatch, tid
):
    """The workflow as the user edits it (a local store), EMULATED phone timing over a 50 Mbit/s link: the loader
    lists both references, the sampler fetches their KV (levels used) and saves the edit's report."""
    import torch

    monkeypatch.setattr(comfy.folder_paths, "output_directory", str(tmp_path))
    schemas = {node_id: cls.GET_SCHEMA() for node_id, cls in node_classes.items()}
    _, api = workflow_defs.render("sakura_two_references", schemas)
    loader = next(n for n in api.values() if n["class_type"] == "SakuraTemplateLoader")
    assert loader["inputs"]["template_id"] == tid
    loader["inputs"].update(source="local store", store_dir=str(pair_store))
    user = examples.user_image("sakura-object.png")
    images = {"sakura-object.png": torch.from_numpy(user.astype(np.float32) / 255.0).unsqueeze(0)}
    out = _run_api(api, node_classes, comfy, images)
    listed = "\n".join(out["2"].ui["text"])
    assert "references: 2 (512 tokens, attending to each other)" in listed
    assert "1. person: " in listed and "2. garment: " in listed
    report = json.loads(out["8"])
    assert [r["name"] for r in report["template"]["references"]] == ["person", "garment"]
    assert "EMULATED snapdragon-8-elite-cpu timing" in report["summary"]
    levels = report["levels_used"]  # {layer: [level per step]}, or "none fetched"
    fetched = [
        lv
        for names in (levels.values() if isinstance(levels, dict) else [])
        for lv in names
        if lv.startswith("sakura-")
    ]
    assert fetched, f"nothing fetched: {report['summary']}; {json.dumps(report.get('decisions'))[:2000]}"
    assert tuple(out["6"].shape) == (1, 64, 64, 3)  # the edit at the demo model's size
    assert tuple(out["12"].shape) == (1, 512, 512, 3)  # and enlarged for viewing
    assert json.loads((tmp_path / "sakura" / "two-references_report_00001.json").read_text()) == report
