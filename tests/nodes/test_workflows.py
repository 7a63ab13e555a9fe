"""The example workflows: both formats generated from one definition, and every API-format node input valid for the
node's schema (the real ComfyUI run is in test_real_comfyui.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WIDGETS = {"INT", "FLOAT", "STRING", "COMBO", "BOOLEAN"}


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("sakura_workflows", HERE / "workflows.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sakura_workflows"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("sakura_workflows", None)


@pytest.fixture(scope="module")
def schemas(node_classes):
    return {node_id: cls.GET_SCHEMA() for node_id, cls in node_classes.items()}


def test_files_match_their_definition(gen, schemas):
    files = gen.render_all(schemas)
    assert len(files) == 8  # four workflows, two formats
    for path, text in files.items():
        assert path.is_file(), f"{path} missing: run .venv/bin/python tests/nodes/workflows.py"
        assert path.read_text() == text, f"{path} is stale: run .venv/bin/python tests/nodes/workflows.py"


def test_the_four_use_cases_are_there(gen):
    api = {p.stem: json.loads(p.read_text()) for p in (gen.OUT / "api").glob("*.json")}
    assert set(api) == {"sakura_face_swap", "sakura_virtual_try_on", "sakura_in_context_edit",
                        "sakura_in_context_edit_on_phone"}  # fmt: skip
    phone = [n for n in api["sakura_in_context_edit_on_phone"].values() if n["class_type"] == "SakuraPhoneDevice"]
    assert len(phone) == 1
    sampler = next(n for n in api["sakura_in_context_edit_on_phone"].values()
                   if n["class_type"] == "SakuraPipelinedSampler")  # fmt: skip
    assert sampler["inputs"]["device"] == ["9", 0]
    # the UI files are what ComfyUI lists: top level of example_workflows/, nodes + links
    for path in gen.OUT.glob("*.json"):
        ui = json.loads(path.read_text())
        assert ui["nodes"] and ui["links"] and ui["last_link_id"] == len(ui["links"])


@pytest.mark.parametrize("name", ["sakura_face_swap", "sakura_virtual_try_on", "sakura_in_context_edit",
                                  "sakura_in_context_edit_on_phone"])  # fmt: skip
def test_api_inputs_fit_the_schemas(gen, schemas, name):
    wf = json.loads((gen.OUT / "api" / f"{name}.json").read_text())
    for node_id, node in wf.items():
        ctype, inputs = node["class_type"], node["inputs"]
        if ctype in gen.CORE_NODES:
            continue
        schema = schemas[ctype]
        declared = {i.id: i for i in schema.inputs}
        assert set(inputs) <= set(declared), f"{name}/{node_id}: unknown inputs {set(inputs) - set(declared)}"
        missing = [i.id for i in schema.inputs if not i.optional and i.id not in inputs]
        assert not missing, f"{name}/{node_id}: missing {missing}"
        for key, value in inputs.items():
            spec = declared[key]
            if spec.io_type in WIDGETS:
                assert not isinstance(value, list), f"{name}/{node_id}.{key} is a widget, not a link"
                if spec.io_type == "COMBO":
                    assert value in spec.options, f"{name}/{node_id}.{key}={value!r} not in {spec.options}"
            else:
                src, slot = value
                src_type = wf[src]["class_type"]
                out_type = (gen.CORE_NODES[src_type][2][slot][1] if src_type in gen.CORE_NODES
                            else schemas[src_type].outputs[slot].io_type)  # fmt: skip
                assert out_type == spec.io_type, f"{name}/{node_id}.{key}: {out_type} into {spec.io_type}"
