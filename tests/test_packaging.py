"""The pack installs the usual ways: ComfyUI-Manager / Comfy Registry metadata, requirements.txt and the import
errors a missing piece gives (``tests/comfyui_manager_install.py`` does the real install against a real ComfyUI)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
STUBS = REPO / "tests" / "nodes" / "stubs"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _requirements() -> list[str]:
    lines = [ln.split("#", 1)[0].strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
    return [ln for ln in lines if ln]


# what ComfyUI (>= 0.29.0, its requirements.txt) installs itself and the pack uses as it comes: not in requirements.txt
COMFYUI_PROVIDES = ("numpy", "aiohttp", "safetensors", "pillow")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_requirements_are_pyprojects_less_torch_and_what_comfyui_provides():
    deps = PYPROJECT["project"]["dependencies"]
    assert "torch>=2.6" in deps  # the pack needs it; ComfyUI brings it
    assert {_name(d) for d in deps} >= set(COMFYUI_PROVIDES)  # a pip install of the CLI still gets them
    assert _requirements() == [d for d in deps if not d.startswith("torch") and _name(d) not in COMFYUI_PROVIDES]
    assert not any(re.match(r"torch(vision|audio)?\b", r) for r in _requirements())  # pip would swap ComfyUI's


def test_requirements_pin_nothing_exactly():
    """Ranges only: an exact pin of a package would replace ComfyUI's (or another pack's) version of it."""
    assert not [r for r in _requirements() if "==" in r]
    diffusers = next(r for r in _requirements() if _name(r) == "diffusers")
    assert diffusers == "diffusers>=0.42.1,<0.43"  # tested with 0.42.1; the Flux2 modules the pack imports


def test_requirements_leave_out_what_a_real_comfyui_installs():
    """Against a real ComfyUI's requirements.txt (``COMFYUI_DIR``): nothing of it listed again, and every package
    the pack leaves to ComfyUI really is in it."""
    import os

    from ci_deps import require_or_skip

    comfy = Path(os.environ.get("COMFYUI_DIR", "")) / "requirements.txt"
    require_or_skip(os.environ.get("COMFYUI_DIR") and comfy.is_file(), "COMFYUI_DIR is not set (a ComfyUI checkout)")
    lines = [ln.split("#", 1)[0].strip() for ln in comfy.read_text().splitlines()]
    theirs = {_name(ln) for ln in lines if ln}
    assert set(COMFYUI_PROVIDES) <= theirs
    assert not {_name(r) for r in _requirements()} & theirs


def test_registry_metadata_is_complete():
    urls = PYPROJECT["project"]["urls"]
    assert urls["Repository"].startswith("https://")
    comfy = PYPROJECT["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"]
    assert re.fullmatch(r">=\d+\.\d+\.\d+", comfy["requires-comfyui"])
    icon = comfy["Icon"]
    assert icon.startswith("https://") and icon.endswith(".svg")
    local = REPO / icon.split("/main/", 1)[1]  # the Icon is this repository's file, served from its main branch
    width, height = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', local.read_text()).groups())
    assert width <= 800 and height <= 400  # the registry's limit


def test_license_file_is_the_declared_one():
    assert PYPROJECT["project"]["license"] == {"text": "Apache-2.0"}
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


LOAD = """
import importlib.util, sys
sys.path.insert(0, {stubs!r})
{prelude}
spec = importlib.util.spec_from_file_location("pack", {init!r}, submodule_search_locations=[{root!r}])
m = importlib.util.module_from_spec(spec); sys.modules["pack"] = m
try:
    spec.loader.exec_module(m)
except ImportError as e:
    print("IMPORT-ERROR", e)
else:
    import sakura_core
    print("LOADED", m.__all__, sakura_core.__file__)
"""
BLOCK = """
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {name!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Missing())
"""
NOT_INSTALLED = """
# a ComfyUI-Manager install: the pack's own packages are not pip-installed, only its folder is there
owner = lambda f: (f if isinstance(f, type) else type(f)).__module__  # setuptools appends a finder class
sys.meta_path[:] = [f for f in sys.meta_path if not owner(f).startswith("__editable__")]
sys.path[:] = [p for p in sys.path if not p.endswith(".pth") and Path(p or ".").resolve() != Path({repo!r})]
"""


def _load(root: Path, prelude: str = "", stubs: Path = STUBS) -> str:
    code = LOAD.format(stubs=str(stubs), prelude=prelude, init=str(root / "__init__.py"), root=str(root))
    proc = subprocess.run([sys.executable, "-c", "from pathlib import Path\n" + code], capture_output=True,
                          text=True, cwd="/", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_missing_requirement_names_the_package_and_the_fix():
    out = _load(REPO, BLOCK.format(name="aiohttp"))
    assert out.startswith("IMPORT-ERROR SAKURA nodes not registered: the Python running ComfyUI")
    assert "lacks the package 'aiohttp'" in out
    assert f"-m pip install -r {REPO / 'requirements.txt'}" in out


def test_a_comfyui_without_the_v3_api_is_named(tmp_path):
    (tmp_path / "comfy_api").mkdir()
    (tmp_path / "comfy_api" / "__init__.py").write_text("")  # an old ComfyUI: comfy_api without latest
    out = _load(REPO, stubs=tmp_path)
    assert out.startswith("IMPORT-ERROR SAKURA nodes not registered: this ComfyUI has no V3 node API")
    assert "update ComfyUI" in out


@pytest.mark.slow
def test_a_copied_pack_loads_its_own_packages(tmp_path):
    """A Manager install (the folder only, sakura_core not pip-installed) registers from the folder's own code."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from comfyui_manager_install import copy_pack
    finally:
        sys.path.remove(str(REPO / "tests"))
    pack = copy_pack(tmp_path / "sakura-kv")
    out = _load(pack, NOT_INSTALLED.format(repo=str(REPO)))
    assert out.startswith("LOADED ['WEB_DIRECTORY', 'comfy_entrypoint']"), out
    assert out.endswith(str(pack / "sakura_core" / "__init__.py"))
