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
    assert len(files) == 10  # five workflows, two formats
    for path, text in files.items():
        assert path.is_file(), f"{path} missing: run .venv/bin/python tests/nodes/workflows.py"
        assert path.read_text() == text, f"{path} is stale: run .venv/bin/python tests/nodes/workflows.py"


def test_the_use_cases_are_there(gen):
    api = {p.stem: json.loads(p.read_text()) for p in (gen.OUT / "api").glob("*.json")}
    assert set(api) == {"sakura_face_swap", "sakura_virtual_try_on", "sakura_in_context_edit",
                        "sakura_in_context_edit_on_phone", "sakura_face_swap_per_step"}  # fmt: skip
    per_step = {n["class_type"]: n["inputs"] for n in api["sakura_face_swap_per_step"].values()}
    assert per_step["SakuraTemplateLoader"]["template_id"] == "face-swap-astronaut-per-step"
    assert per_step["SakuraPipelinedSampler"]["steps"] == 4  # the schedule the template was precomputed for
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
                                  "sakura_in_context_edit_on_phone", "sakura_face_swap_per_step"])  # fmt: skip
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


def _widget_error(spec, value) -> str | None:
    """Why ComfyUI would refuse ``value`` for the widget ``spec`` (its /prompt validation: the conversion to the
    widget's type, then min/max, then the combo's options), or None."""
    kind = spec.io_type
    if kind == "COMBO":
        return None if value in spec.options else f"{value!r} not in {spec.options}"
    expected = {"INT": int, "FLOAT": (int, float), "STRING": str, "BOOLEAN": bool}[kind]
    if value is None or isinstance(value, bool) != (kind == "BOOLEAN") or not isinstance(value, expected):
        return f"{value!r} is not a {kind} value"
    if kind in ("INT", "FLOAT"):
        if spec.min is not None and value < spec.min:
            return f"{value!r} below min {spec.min}"
        if spec.max is not None and value > spec.max:
            return f"{value!r} above max {spec.max}"
    return None


@pytest.mark.parametrize("name", ["sakura_face_swap", "sakura_virtual_try_on", "sakura_in_context_edit",
                                  "sakura_in_context_edit_on_phone", "sakura_face_swap_per_step"])  # fmt: skip
def test_ui_widget_values_fit_the_schemas(gen, schemas, name):
    """Each UI-format node's ``widgets_values``, read in widget order as the frontend reads them (a seed's
    control_after_generate mode follows its value), is a value the backend accepts: no ``null``, right type, in
    bounds, in the combo's options."""
    ui = json.loads((gen.OUT / f"{name}.json").read_text())
    for node in ui["nodes"]:
        if node["type"] in gen.CORE_NODES:
            continue
        widgets = [i for i in schemas[node["type"]].inputs if i.io_type in WIDGETS]
        values = list(node["widgets_values"])
        for spec in widgets:
            assert values, f"{name}/{node['type']}: no value for widget {spec.id}"
            value = values.pop(0)
            error = _widget_error(spec, value)
            assert error is None, f"{name}/{node['type']}.{spec.id}: {error}"
            if getattr(spec, "control_after_generate", False):
                assert values.pop(0) in ("fixed", "increment", "decrement", "randomize")
        assert not values, f"{name}/{node['type']}: {len(values)} widget values left over"


def test_every_widget_has_a_valid_default(schemas):
    """A workflow that omits a widget gets its default; it must be a value the backend accepts."""
    for node_id, schema in schemas.items():
        for spec in schema.inputs:
            if spec.io_type in WIDGETS:
                assert _widget_error(spec, spec.default) is None, f"{node_id}.{spec.id} default {spec.default!r}"


def test_a_null_widget_value_is_caught(schemas):
    fetch = {i.id: i for i in schemas["SakuraAdaptiveFetch"].inputs}
    assert _widget_error(fetch["latency_target_s"], None) == "None is not a FLOAT value"
    assert _widget_error(fetch["latency_target_s"], -1.0) == "-1.0 below min 0.0"
    assert _widget_error(fetch["policy"], "nope").startswith("'nope' not in")


@pytest.mark.parametrize("name", ["sakura_face_swap", "sakura_virtual_try_on", "sakura_in_context_edit",
                                  "sakura_in_context_edit_on_phone", "sakura_face_swap_per_step"])  # fmt: skip
def test_ui_workflow_has_thumbnail_note_and_no_overlaps(gen, name):
    from PIL import Image

    with Image.open(gen.OUT / f"{name}.jpg") as thumb:  # what the template browser shows beside the file name
        assert thumb.format == "JPEG" and thumb.size == (256, 256)
    ui = json.loads((gen.OUT / f"{name}.json").read_text())
    notes = [n for n in ui["nodes"] if n["type"] == "Note"]
    assert len(notes) == 1 and "sakura serve" in notes[0]["widgets_values"][0]
    title_h = 30  # the frontend draws the title bar above pos
    boxes = [(n["title"], n["pos"][0], n["pos"][1] - title_h, n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
             for n in ui["nodes"]]  # fmt: skip
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap = a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
            assert not overlap, f"{name}: {a[0]!r} overlaps {b[0]!r}"
    api = json.loads((gen.OUT / "api" / f"{name}.json").read_text())
    assert "Note" not in {n["class_type"] for n in api.values()}  # frontend-only: not sent to /prompt
