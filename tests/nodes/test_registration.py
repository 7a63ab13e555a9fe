"""Registration and schemas of the Sakura nodes against the stand-in ComfyUI API (fast; no server)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sakura_core.fetch.sources import ServerSource

REPO = Path(__file__).resolve().parents[2]

EXPECTED = {
    "SakuraModelLoader": ([], ["SAKURA_MODEL"]),
    "SakuraTemplateLoader": (["SAKURA_MODEL"], ["SAKURA_TEMPLATE"]),
    "SakuraAdaptiveFetch": (["SAKURA_TEMPLATE"], ["SAKURA_KV_STREAM"]),
    "SakuraPipelinedSampler": (
        ["SAKURA_MODEL", "SAKURA_KV_STREAM", "IMAGE", "SAKURA_DEVICE"],
        ["IMAGE", "STRING", "IMAGE"],
    ),
    "SakuraPhoneDevice": ([], ["SAKURA_DEVICE"]),
    "SakuraTemplateKV": (["MODEL", "SAKURA_TEMPLATE", "SAKURA_KV_STREAM"], ["MODEL"]),
    "SakuraTemplateKVReport": (["MODEL", "LATENT"], ["STRING"]),
}
WIDGETS = {"INT", "FLOAT", "STRING", "COMBO", "BOOLEAN"}


def test_root_registers_nothing_without_comfy():
    """Outside ComfyUI the root package imports no node module and exports no entry point."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('pkg', {str(REPO / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(REPO)!r}])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['pkg'] = m; spec.loader.exec_module(m)\n"
        "assert m.__all__ == [], m.__all__\n"
        "assert not hasattr(m, 'comfy_entrypoint')\n"
        "assert 'pkg.nodes' not in sys.modules\n"
        "assert 'torch' not in sys.modules and 'sakura_core' not in sys.modules, 'imported something heavy'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_entrypoint_lists_every_sakura_node(node_classes):
    assert set(node_classes) == set(EXPECTED)


@pytest.mark.parametrize("node_id", sorted(EXPECTED))
def test_schema_is_valid(comfy, node_classes, node_id):
    cls = node_classes[node_id]
    schema = cls.GET_SCHEMA()  # validates unique ids
    assert schema.node_id == node_id
    assert schema.display_name.startswith("Sakura ")
    assert schema.category == "sakura"
    assert schema.description
    sockets = [i.io_type for i in schema.inputs if i.io_type not in WIDGETS]
    assert sockets == EXPECTED[node_id][0]
    assert [o.io_type for o in schema.outputs] == EXPECTED[node_id][1]
    # ComfyUI passes every input as a keyword argument: execute must take exactly these
    params = [p for p in inspect.signature(cls.execute).parameters if p != "cls"]
    assert params == [i.id for i in schema.inputs]
    for i in schema.inputs:
        if i.io_type == "COMBO":
            assert i.options, f"{node_id}.{i.id}: empty combo"
            assert i.default in i.options, f"{node_id}.{i.id}: default {i.default!r} not an option"
        if i.io_type in ("INT", "FLOAT"):
            assert i.min <= i.default <= i.max
        if i.optional:
            assert inspect.signature(cls.execute).parameters[i.id].default is None
    # the frontend shows these on hover: every input and output says what it is for
    assert all(i.tooltip for i in schema.inputs), [i.id for i in schema.inputs if not i.tooltip]
    assert all(o.tooltip for o in schema.outputs), [o.id for o in schema.outputs if not o.tooltip]


def test_fetch_offers_every_runnable_policy(node_classes):
    from sakura_core.policy.policies import POLICIES

    schema = node_classes["SakuraAdaptiveFetch"].GET_SCHEMA()
    policy = next(i for i in schema.inputs if i.id == "policy")
    assert policy.options == [name for name, cls in POLICIES.items() if not (cls.kv_preloaded or cls.simulation_only)]
    assert {"sakura", "on-device", "fetch-fp16", "cachegen", "oracle"} <= set(policy.options)
    assert "free-kv" not in policy.options  # simulation-only bound
    assert "cachegen-no-floor" not in policy.options  # the old CacheGen rule, reported once in the simulator
    trace = next(i for i in schema.inputs if i.id == "trace")
    assert "norway_bus_1" in trace.options


def test_fetch_settings_errors_are_readable(comfy, node_classes, run_node, tmp_path):
    handle = comfy.nodes._stream.TemplateHandle("t", "m" * 64, ServerSource("http://127.0.0.1:9"))
    fetch = node_classes["SakuraAdaptiveFetch"]
    missing = tmp_path / "nope.trace"
    with pytest.raises(comfy.nodes._common.SakuraNodeError, match="nope.trace"):
        run_node(
            fetch,
            template=handle,
            policy="sakura",
            bandwidth="trace file",
            fixed_mbit_s=5.0,
            trace="norway_bus_1",
            trace_path=str(missing),
        )
    with pytest.raises(comfy.nodes._common.SakuraNodeError, match="free-kv"):
        run_node(
            fetch,
            template=handle,
            policy="free-kv",
            bandwidth="live",
            fixed_mbit_s=5.0,
            trace="norway_bus_1",
            trace_path="",
        )


@pytest.fixture
def diffusers_root(comfy, tmp_path, demo_model):
    """models/diffusers with: a demo-geometry transformer folder (+ spec), a pipeline whose transformer has no
    spec, and an unrelated diffusers model."""
    root = tmp_path / "models" / "diffusers"
    good = root / "sakura-demo-copy"
    demo_model.adapter.model.save_pretrained(str(good))
    spec = {k: v for k, v in json.loads((REPO / "sakura_core/models/demo_model.json").read_text()).items()}
    for key in ("transformer", "weights", "init_seed"):
        spec.pop(key)
    (good / "sakura_spec.json").write_text(json.dumps(spec))
    latent = root / "flux2-klein-kv" / "transformer"
    latent.mkdir(parents=True)
    (latent / "config.json").write_text(json.dumps({"_class_name": "Flux2Transformer2DModel", "in_channels": 128}))
    other = root / "some-unet"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"_class_name": "UNet2DConditionModel"}))
    saved = comfy.folder_paths.folder_names_and_paths["diffusers"]
    comfy.folder_paths.folder_names_and_paths["diffusers"] = ([str(root)], {"folder"})
    try:
        yield root
    finally:
        comfy.folder_paths.folder_names_and_paths["diffusers"] = saved


def test_model_loader_lists_transformer_folders(node_classes, diffusers_root):
    schema = node_classes["SakuraModelLoader"].GET_SCHEMA()
    assert schema.inputs[0].options == [
        "demo (embedded)",
        "klein single files (below)",
        "flux2-klein-kv/transformer",
        "sakura-demo-copy",
    ]


def test_model_loader_loads_a_folder(node_classes, run_node, diffusers_root, demo_model):
    (model,) = run_node(node_classes["SakuraModelLoader"], model_name="sakura-demo-copy")
    assert model.model_id == demo_model.model_id  # same config and weights: the same KV is valid
    assert model.spec.grid == demo_model.spec.grid
    assert model.weights_source == "folder:sakura-demo-copy"


def test_model_loader_errors_are_readable(comfy, node_classes, run_node, diffusers_root):
    err = comfy.nodes._common.SakuraNodeError
    loader = node_classes["SakuraModelLoader"]
    with pytest.raises(err, match=r"no sakura_spec\.json.*in_channels=128|in_channels=128.*no sakura_spec\.json"):
        run_node(loader, model_name="flux2-klein-kv/transformer")
    with pytest.raises(err, match="not among the FLUX.2 klein / transformer folders.*found: flux2-klein-kv"):
        run_node(loader, model_name="some-unet")
    (diffusers_root / "sakura-demo-copy" / "sakura_spec.json").write_text(json.dumps({"patch_size": 5}))
    with pytest.raises(err, match="does not fit the transformer"):
        run_node(loader, model_name="sakura-demo-copy")
