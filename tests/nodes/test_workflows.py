"""The example workflows: both formats generated from one definition, every API-format node input valid for the
node's schema, every node large enough to show its widgets and previews (the real ComfyUI run is in
test_real_comfyui.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WEB_JS = HERE.parents[1] / "web" / "sakura.js"
WIDGETS = {"INT", "FLOAT", "STRING", "COMBO", "BOOLEAN"}
SHIPPED = [
    "sakura_face_swap",
    "sakura_in_context_edit",
    "sakura_in_context_edit_on_phone",
    "sakura_face_swap_per_step",
]

# What LiteGraph draws (ComfyUI's frontend), to check sizes without a browser. A widget row shows its label on the
# left and its value on the right and cuts the label first ("d…" of device_timing) when the two do not fit: they need
# the node's width minus TEXT_PAD_PX (2 x 15 px margin on each side, 5 px left and 20 px right padding, a 5 px gap).
CHAR_PX = 6.5  # a generous average advance of the widget font (12 px sans-serif; Arial's is ~6 px)
TEXT_PAD_PX = 90
ROW_PX = 20  # an input/output slot row
WIDGET_ROW_PX = 24  # a widget row: 20 px and a 4 px gap
MULTILINE_PX = 60  # a multiline text widget (the sampler's prompt): a few lines
PREVIEW_PX = 384  # the smallest side of an image preview's room that shows a readable image
# ComfyUI's own node types -> their smallest (width, height) in a shipped workflow
CORE_MIN_PX = {
    "LoadImage": (320, ROW_PX + 2 * WIDGET_ROW_PX + 256),  # the user image's preview below its widgets
    "SaveImage": (360, ROW_PX + WIDGET_ROW_PX + 64 + 40),  # the 64 px edit at its size, as ComfyUI shows it
    "PreviewImage": (PREVIEW_PX, ROW_PX + PREVIEW_PX),  # the timeline; the edit enlarged
    "ImageScaleBy": (320, ROW_PX + 2 * WIDGET_ROW_PX),
    "PreviewAny": (PREVIEW_PX, PREVIEW_PX),  # the report's JSON text
    "Note": (380, 400),
}


@pytest.fixture(scope="module")
def gen(workflow_defs):
    return workflow_defs


@pytest.fixture(scope="module")
def schemas(node_classes):
    return {node_id: cls.GET_SCHEMA() for node_id, cls in node_classes.items()}


def test_files_match_their_definition(gen, schemas):
    files = gen.render_all(schemas)
    assert len(files) == 8  # four workflows, two formats
    for path, text in files.items():
        assert path.is_file(), f"{path} missing: run .venv/bin/python tests/nodes/workflows.py"
        assert path.read_text() == text, f"{path} is stale: run .venv/bin/python tests/nodes/workflows.py"


def test_the_use_cases_are_there(gen):
    api = {p.stem: json.loads(p.read_text()) for p in (gen.OUT / "api").glob("*.json")}
    assert set(api) == set(SHIPPED) == set(gen.WORKFLOWS)
    assert not set(gen.TEST_WORKFLOWS) & set(SHIPPED)  # the tests' own workflows are not shipped
    per_step = {n["class_type"]: n["inputs"] for n in api["sakura_face_swap_per_step"].values()}
    assert per_step["SakuraTemplateLoader"]["template_id"] == "face-swap-astronaut-per-step"
    assert per_step["SakuraPipelinedSampler"]["steps"] == 4  # the schedule the template was precomputed for
    phone = [n for n in api["sakura_in_context_edit_on_phone"].values() if n["class_type"] == "SakuraPhoneDevice"]
    assert len(phone) == 1
    sampler = next(
        n for n in api["sakura_in_context_edit_on_phone"].values() if n["class_type"] == "SakuraPipelinedSampler"
    )
    assert sampler["inputs"]["device"] == ["9", 0]
    # the UI files are what ComfyUI lists: top level of example_workflows/, nodes + links
    for path in gen.OUT.glob("*.json"):
        ui = json.loads(path.read_text())
        assert ui["nodes"] and ui["links"] and ui["last_link_id"] == len(ui["links"])


@pytest.mark.parametrize("name", SHIPPED)
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
                out_type = (
                    gen.CORE_NODES[src_type][2][slot][1]
                    if src_type in gen.CORE_NODES
                    else schemas[src_type].outputs[slot].io_type
                )
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


@pytest.mark.parametrize("name", SHIPPED)
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


@pytest.mark.parametrize("name", SHIPPED)
def test_ui_workflow_has_thumbnail_note_and_no_overlaps(gen, name):
    from PIL import Image

    with Image.open(gen.OUT / f"{name}.jpg") as thumb:  # what the template browser shows beside the file name
        assert thumb.format == "JPEG" and thumb.size == (256, 256)
    ui = json.loads((gen.OUT / f"{name}.json").read_text())
    notes = [n for n in ui["nodes"] if n["type"] == "Note"]
    assert len(notes) == 1 and "sakura serve" in notes[0]["widgets_values"][0]
    title_h = 30  # the frontend draws the title bar above pos
    boxes = [
        (n["title"], n["pos"][0], n["pos"][1] - title_h, n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
        for n in ui["nodes"]
    ]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap = a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
            assert not overlap, f"{name}: {a[0]!r} overlaps {b[0]!r}"
    api = json.loads((gen.OUT / "api" / f"{name}.json").read_text())
    assert "Note" not in {n["class_type"] for n in api.values()}  # frontend-only: not sent to /prompt


def _js_min_width_px() -> dict[str, int]:
    """``MIN_WIDTH_PX`` of web/sakura.js: the width each Sakura node gets when a user adds it."""
    found = re.search(r"^const MIN_WIDTH_PX = (\{.*\});$", WEB_JS.read_text(), re.M)
    assert found, f"{WEB_JS}: no one-line `const MIN_WIDTH_PX = {{...}};`"
    return json.loads(found.group(1))


def _js_constant(name: str) -> float:
    found = re.search(rf"^const {name} = ([\d.]+);", WEB_JS.read_text(), re.M)
    assert found, f"{WEB_JS}: no `const {name} = <number>;`"
    return float(found.group(1))


def _row_px(label: str, value) -> float:
    """The width a widget row needs to show ``label`` and ``value`` uncut."""
    return CHAR_PX * (len(label) + len(str(value))) + TEXT_PAD_PX


def _min_height_px(schema) -> float:
    """The body height a Sakura node needs: its slot rows, widget rows (a multiline text more) and, on the Template KV
    Loader, web/sakura.js's button and status box at its smallest; on the Phone Device, its pairing button."""
    sockets = [i for i in schema.inputs if i.io_type not in WIDGETS]
    widgets = [i for i in schema.inputs if i.io_type in WIDGETS]
    height = max(len(sockets), len(schema.outputs)) * ROW_PX
    height += sum(MULTILINE_PX if getattr(i, "multiline", False) else WIDGET_ROW_PX for i in widgets)
    height += WIDGET_ROW_PX * sum(bool(getattr(i, "control_after_generate", False)) for i in widgets)
    if schema.node_id == "SakuraTemplateLoader":
        box_px = _js_constant("INFO_MIN_LINES") * _js_constant("INFO_LINE_PX") + _js_constant("INFO_PAD_PX")
        height += WIDGET_ROW_PX + box_px
    if schema.node_id == "SakuraPhoneDevice":
        height += WIDGET_ROW_PX  # web/sakura.js's "pair a phone page" button
    return height


def _shown_widgets(gen, schemas, node) -> list[tuple[str, object]]:
    """(label, value) of each single-line widget of a UI-format node, as the frontend pairs ``widgets_values``."""
    if node["type"] in gen.CORE_NODES:
        names = [(n, False) for n, _ in gen.CORE_NODES[node["type"]][1] if n not in gen.API_ONLY_WIDGETS]
        multiline = {"text"} if node["type"] == "Note" else set()
    else:
        names = gen.node_interface(node["type"], schemas)[1]
        multiline = {i.id for i in schemas[node["type"]].inputs if getattr(i, "multiline", False)}
    values, out = list(node["widgets_values"]), []
    for name, control in names:
        value = values.pop(0)
        if control:
            values.pop(0)  # the seed's control_after_generate: a short word
        if name not in multiline:
            out.append((name, value))
    return out


def _too_small(gen, schemas, ui: dict) -> list[str]:
    """What is too small in the UI-format workflow ``ui``: a node smaller than it needs (rows, web/sakura.js's status
    box and width for a Sakura node, image previews of at least PREVIEW_PX a side) or a single-line widget whose label
    and value do not both fit."""
    min_width, problems = _js_min_width_px(), []
    for node in ui["nodes"]:
        kind, (width, height) = node["type"], node["size"]
        where = f"{node['title']} ({kind}, {width}x{height})"
        if kind in gen.CORE_NODES:
            need_w, need_h = CORE_MIN_PX[kind]
        else:
            need_w, need_h = min_width[kind], _min_height_px(schemas[kind])
        if width < need_w or height < need_h:
            problems.append(f"{where}: smaller than {need_w}x{need_h:.0f}")
        for label, value in _shown_widgets(gen, schemas, node):
            if width < _row_px(label, value):
                problems.append(f"{where}: {label}={value!r} needs {_row_px(label, value):.0f} px")
    return problems


@pytest.mark.parametrize("name", SHIPPED)
def test_every_node_is_large_enough(gen, schemas, name):
    ui = json.loads((gen.OUT / f"{name}.json").read_text())
    assert _too_small(gen, schemas, ui) == []


def test_the_size_check_catches_what_the_tester_saw(gen, schemas):
    """The sizes shipped before issue 44: device_timing's label cut to "d…" on the 360 px sampler, a 2-line status
    box on the Template KV Loader, a timeline preview of 340 x 300 px."""
    old = {"SakuraTemplateLoader": [340, 250], "SakuraPipelinedSampler": [360, 300], "PreviewImage": [340, 300]}
    ui = json.loads((gen.OUT / "sakura_face_swap_per_step.json").read_text())
    for node in ui["nodes"]:
        node["size"] = old.get(node["type"], node["size"])
    problems = "\n".join(_too_small(gen, schemas, ui))
    assert "device_timing='emulated phone: snapdragon-8-elite-cpu' needs" in problems
    assert "template_id='face-swap-astronaut-per-step' needs" in problems
    for kind in old:
        assert f"({kind}, {old[kind][0]}x{old[kind][1]}): smaller than" in problems, (kind, problems)


def test_a_new_sakura_node_is_wide_enough_for_any_combo_value(schemas):
    """web/sakura.js widens a Sakura node a user adds to MIN_WIDTH_PX: room for each combo's label with its longest
    option and each single-line text's label with its default."""
    min_width = _js_min_width_px()
    assert set(min_width) == set(schemas)
    for node_id, schema in schemas.items():
        for spec in schema.inputs:
            if spec.io_type == "COMBO":
                longest = max(map(str, spec.options), key=len)
            elif spec.io_type in WIDGETS and not getattr(spec, "multiline", False):
                longest = str(spec.default)
            else:
                continue
            need = _row_px(spec.id, longest)
            assert min_width[node_id] >= need, f"{node_id}.{spec.id}={longest!r} needs {math.ceil(need)} px"


@pytest.mark.parametrize("name", SHIPPED)
def test_the_edit_is_shown_enlarged(gen, name):
    """ComfyUI's previews never scale an image up, so the demo model's 64 px edit would stay 64 px in any node: each
    workflow enlarges it (nearest) into a preview of at least PREVIEW_PX, and saves it at its own size."""
    api = json.loads((gen.OUT / "api" / f"{name}.json").read_text())
    sampler = next(k for k, n in api.items() if n["class_type"] == "SakuraPipelinedSampler")
    scale = next(k for k, n in api.items() if n["class_type"] == "ImageScaleBy")
    assert api[scale]["inputs"]["image"] == [sampler, 0]
    assert api[scale]["inputs"]["upscale_method"] == "nearest-exact" and 64 * api[scale]["inputs"]["scale_by"] >= 512
    shown = [k for k, n in api.items() if n["class_type"] == "PreviewImage" and n["inputs"]["images"] == [scale, 0]]
    assert len(shown) == 1
    ui = {str(n["id"]): n for n in json.loads((gen.OUT / f"{name}.json").read_text())["nodes"]}
    assert min(ui[shown[0]]["size"]) >= 512  # the enlarged edit whole
    saved = [n for n in api.values() if n["class_type"] == "SaveImage"]
    assert len(saved) == 1 and saved[0]["inputs"]["images"] == [sampler, 0]
