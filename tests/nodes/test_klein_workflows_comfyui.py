"""The FLUX.2 [klein] example workflows against a real ComfyUI 0.29's node schemas (``COMFYUI_DIR``,
``COMFYUI_PYTHON``): ComfyUI started with the pack as test_real_comfyui.py starts it, its ``/object_info`` read once,
every node type there, every widget value valid (a model file not installed here allowed, but a file name), every
link of matching types, every required input linked. They are not run: they need the real klein 4B files, and
ComfyUI's CLIPLoader / VAELoader cannot load a tiny klein's Qwen3 / VAE (docs/comfyui.md)."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
from ci_deps import require_or_skip

from .conftest import start_comfyui, stop_process
from .test_klein_workflows import NAMES, _ui, broken_variants
from .ui_schema_check import problems

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]

COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "")
require_or_skip(
    bool(COMFYUI_DIR), "COMFYUI_DIR is not set: this test needs ComfyUI 0.29 (DEVELOPERS.md)", allow_module_level=True
)


@pytest.fixture(scope="module")
def object_info(tmp_path_factory, examples, comfyui_python):
    proc, url, log = start_comfyui(
        COMFYUI_DIR, tmp_path_factory.mktemp("comfyui-klein"), examples, python=comfyui_python
    )
    try:
        with urllib.request.urlopen(f"{url}/object_info", timeout=60) as resp:
            info = json.loads(resp.read())
    finally:
        stop_process(proc)
    assert "SakuraTemplateKV" in info, "".join(log[-60:])
    return info


@pytest.mark.parametrize("name", NAMES)
def test_workflow_fits_comfyuis_schemas(object_info, name):
    assert problems(_ui(name), object_info) == []


def test_the_check_catches_broken_workflows(object_info):
    for what, (bad, phrase) in broken_variants(_ui("sakura_klein_face_swap")).items():
        found = problems(bad, object_info)
        assert any(phrase in p for p in found), f"{what}: {found}"
