"""The FLUX.2 [klein] example workflows (``klein_workflows.py``: ComfyUI's native klein nodes + the Sakura Template
KV patch), checked without ComfyUI: the files match their definition, every node and link fits our nodes' schemas and
``klein_workflows.NATIVE`` (ComfyUI 0.29's nodes as its /object_info gives them; ``test_klein_workflows_comfyui.py``
checks against the real one), the notes say what to download and precompute. No test runs them: they need the real
klein 4B files (docs/comfyui.md)."""

from __future__ import annotations

import copy
import json

import pytest

from . import klein_workflows as kw
from .ui_schema_check import object_info_of, problems

NAMES = sorted(kw.KLEIN_WORKFLOWS)


@pytest.fixture(scope="module")
def schemas(node_classes):
    return {**{node_id: cls.GET_SCHEMA() for node_id, cls in node_classes.items()}, **kw.native_schemas()}


@pytest.fixture(scope="module")
def info(schemas):
    return object_info_of(schemas)


def _ui(name: str) -> dict:
    return json.loads((kw.OUT / f"{name}.json").read_text())


def test_files_match_their_definition(schemas):
    from PIL import Image

    files = kw.render_klein(schemas)
    assert sorted(p.stem for p in files) == NAMES
    for path, text in files.items():
        assert path.is_file() and path.read_text() == text, f"{path} stale: run tests/nodes/klein_workflows.py"
        with Image.open(path.with_suffix(".jpg")) as thumb:  # what the template browser shows
            assert thumb.format == "JPEG" and thumb.size == (256, 256)
    assert not (kw.OUT / "api" / f"{NAMES[0]}.json").exists()  # UI only: nothing runs them here


@pytest.mark.parametrize("name", NAMES)
def test_workflow_fits_the_schemas(info, name):
    assert problems(_ui(name), info) == []


@pytest.mark.parametrize("name", NAMES)
def test_native_klein_chain_with_the_patch(name):
    ui = _ui(name)
    by_id = {n["id"]: n for n in ui["nodes"]}
    types = {n["type"] for n in ui["nodes"]}
    assert {
        "UNETLoader",
        "CLIPLoader",
        "VAELoader",
        "LoadImage",
        "VAEEncode",
        "CLIPTextEncode",
        "VAEDecode",
        "SaveImage",
        "SakuraTemplateLoader",
        "SakuraAdaptiveFetch",
        "SakuraTemplateKV",
        "SakuraTemplateKVReport",
    } <= types
    clip = next(n for n in ui["nodes"] if n["type"] == "CLIPLoader")
    assert clip["widgets_values"][:2] == [kw.TEXT_ENCODER, "flux2"]
    links = {link[0]: link for link in ui["links"]}

    def source(node, name):
        return by_id[links[next(i["link"] for i in node["inputs"] if i["name"] == name)][1]]

    patch = next(n for n in ui["nodes"] if n["type"] == "SakuraTemplateKV")
    assert source(patch, "model")["type"] == "UNETLoader"
    assert source(patch, "kv_stream")["type"] == "SakuraAdaptiveFetch"
    sampler = next(n for n in ui["nodes"] if n["type"] in ("KSampler", "BasicGuider"))
    assert source(sampler, "model") is patch  # the sampler runs the patched MODEL
    report = next(n for n in ui["nodes"] if n["type"] == "SakuraTemplateKVReport")
    assert source(report, "model") is patch


@pytest.mark.parametrize("name", NAMES)
def test_note_says_what_to_download_and_precompute(name):
    notes = [n for n in _ui(name)["nodes"] if n["type"] == "Note"]
    assert len(notes) == 1
    text = notes[0]["widgets_values"][0]
    for needed in (
        f"models/diffusion_models/{kw.UNET}",
        f"models/text_encoders/{kw.TEXT_ENCODER}",
        f"models/vae/{kw.VAE}",
        "sakura precompute --model klein-files:",
        "EXACT weights",
        "docs/comfyui.md",
    ):
        assert needed in text, f"{name}: the note lacks {needed!r}"
    template = next(n for n in _ui(name)["nodes"] if n["type"] == "SakuraTemplateLoader")["widgets_values"][0]
    assert f"--id {template} " in text


@pytest.mark.parametrize("name", NAMES)
def test_no_overlaps(name):
    boxes = [
        (n["title"], n["pos"][0], n["pos"][1] - 30, n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
        for n in _ui(name)["nodes"]
    ]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not (a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]), f"{a[0]!r} overlaps {b[0]!r}"


def broken_variants(ui: dict) -> dict[str, tuple[dict, str]]:
    """{what: (the workflow broken that way, a phrase the check must report)}: a misspelled node, a wrong link type,
    a missing required input, a bad widget value."""
    out = {}
    bad = copy.deepcopy(ui)
    next(n for n in bad["nodes"] if n["type"] == "VAEDecode")["type"] = "VAEDecodee"
    out["misspelled node"] = (bad, "unknown node type 'VAEDecodee'")
    bad = copy.deepcopy(ui)  # the VAE into the patch's MODEL input
    patch = next(n for n in bad["nodes"] if n["type"] == "SakuraTemplateKV")
    link = next(li for li in bad["links"] if li[0] == patch["inputs"][0]["link"])
    link[1], link[2], link[5] = next(n["id"] for n in bad["nodes"] if n["type"] == "VAELoader"), 0, "VAE"
    out["wrong link type"] = (bad, "VAELoader output VAE into SakuraTemplateKV.model (MODEL)")
    bad = copy.deepcopy(ui)
    decode = next(n for n in bad["nodes"] if n["type"] == "VAEDecode")
    gone = decode["inputs"][1]["link"]
    decode["inputs"][1]["link"] = None
    bad["links"] = [li for li in bad["links"] if li[0] != gone]
    out["missing required input"] = (bad, "required input 'vae' (VAE) is not linked")
    bad = copy.deepcopy(ui)
    next(n for n in bad["nodes"] if n["type"] == "CLIPLoader")["widgets_values"][1] = "flux3"
    out["bad combo value"] = (bad, "CLIPLoader #2).type: 'flux3' not in")
    return out


def test_the_check_catches_broken_workflows(info):
    ui = _ui("sakura_klein_face_swap")
    for what, (bad, phrase) in broken_variants(ui).items():
        found = problems(bad, info)
        assert any(phrase in p for p in found), f"{what}: {found}"
    # a model file not installed is allowed, but it must be a file name
    bad = copy.deepcopy(ui)
    next(n for n in bad["nodes"] if n["type"] == "UNETLoader")["widgets_values"][0] = 7
    assert any("UNETLoader #1).unet_name: 7 not in" in p for p in problems(bad, info))
