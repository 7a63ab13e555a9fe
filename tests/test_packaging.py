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
    proc = subprocess.run(
        [sys.executable, "-c", "from pathlib import Path\n" + code],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
    )
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


# ---- the product and the tools (issue 51) ------------------------------------------------------------------------
#: The product's packages: what the wheel installs and a ComfyUI install loads; sakura_tools (benchmarks, test
#: servers, demo training) is neither.
PRODUCT = ("sakura_core", "cloud_server", "android_bridge")
#: requirements.txt's distributions -> the module the product imports them as
IMPORT_NAMES = {"scikit-image": "skimage"}

PRODUCT_IMPORTS = """
import importlib, importlib.util, json, pkgutil, sys
sys.path[:0] = [{repo!r}, {stubs!r}]
tried = []


class _Record:  # every import of a sakura_tools module is seen here first, whatever catches its error
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "sakura_tools":
            tried.append(name)


sys.meta_path.insert(0, _Record())
spec = importlib.util.spec_from_file_location("pack", {init!r}, submodule_search_locations=[{repo!r}])
pack = importlib.util.module_from_spec(spec); sys.modules["pack"] = pack; spec.loader.exec_module(pack)
nodes = [importlib.import_module("pack.nodes." + m.name).__name__ for m in pkgutil.iter_modules([{repo!r} + "/nodes"])]
from sakura_core.cli import COMMANDS
commands = sorted({{m for m, _ in COMMANDS.values() if not m.startswith("sakura_tools.")}})
for name in commands:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "sakura_tools")
product = list(tried)
importlib.import_module("sakura_tools.bench.cli_results")  # the control: a tools import is seen
out = {{"registered": pack.__all__, "nodes": nodes, "commands": commands, "tried": product, "loaded": loaded}}
print(json.dumps({{**out, "control": tried[len(product):]}}))
"""


def _product_imports() -> dict:
    import json

    code = PRODUCT_IMPORTS.format(repo=str(REPO), stubs=str(STUBS), init=str(REPO / "__init__.py"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_nodes_and_the_product_commands_import_no_tool():
    """The pack as ComfyUI loads it (every module of nodes/) and every product command of ``sakura`` (serve,
    precompute, demo, phone-agent, ...) never even look for a ``sakura_tools`` module."""
    out = _product_imports()
    assert out["registered"] == ["WEB_DIRECTORY", "comfy_entrypoint"]
    assert len(out["nodes"]) >= 10 and "pack.nodes.pipelined_sampler" in out["nodes"]
    assert {"cloud_server.cli_serve", "cloud_server.cli_precompute", "sakura_core.cli_demo"} <= set(out["commands"])
    assert "android_bridge.cli_phone_agent" in out["commands"]
    assert out["tried"] == [] and out["loaded"] == []
    assert "sakura_tools.bench.cli_results" in out["control"]  # the check sees a tools import when there is one


def test_the_wheel_holds_the_product_and_not_the_tools():
    """pyproject's package list: the product's packages, never ``sakura_tools`` (nor ``nodes``: ComfyUI's name)."""
    from fnmatch import fnmatch

    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    top = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    assert {"sakura_tools", "nodes", *PRODUCT} <= top
    assert {name for name in top if any(fnmatch(name, pattern) for pattern in include)} == set(PRODUCT)
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert set(data) <= set(PRODUCT)  # the tools' data (the bench's ladder JSON) stays in the repository


def _top_imports(packages: tuple[str, ...]) -> set[str]:
    import ast

    names = set()
    for pkg in packages:
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    return names


def test_requirements_are_what_the_product_imports():
    """Every package ComfyUI-Manager installs from requirements.txt is imported by the nodes or the core (none only
    by the tools): matplotlib draws the nodes' timeline images, constriction codes the CacheGen shards."""
    product = _top_imports(("nodes", *PRODUCT))
    wanted = {IMPORT_NAMES.get(_name(r), _name(r)) for r in _requirements()}
    assert wanted - product == set()
    assert {"matplotlib", "constriction"} <= wanted


ENTRY_POINT = """
import importlib.machinery, sys
from pathlib import Path
{not_installed}


class _Editable:  # what `pip install -e .` installs: a finder that maps the product's packages to their folders
    def find_spec(self, name, path=None, target=None):
        if name in {packages!r}:
            return importlib.machinery.PathFinder.find_spec(name, [{site!r}])


sys.meta_path.append(_Editable())
module, _, attr = {script!r}.partition(":")
main = getattr(__import__(module, fromlist=[attr]), attr)  # the `sakura` console script's target
try:
    code = main({argv!r})
except SystemExit as e:  # argparse's --help
    code = e.code
tools = sys.modules.get("sakura_tools")
print("EXIT", code, getattr(tools, "__file__", None))
"""


def _sakura(site: Path, argv: list[str]) -> tuple[str, str]:
    code = ENTRY_POINT.format(
        not_installed=NOT_INSTALLED.format(repo=str(REPO)),
        packages=PRODUCT,
        site=str(site),
        script=PYPROJECT["project"]["scripts"]["sakura"],
        argv=argv,
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def test_a_repository_install_offers_the_bench_commands():
    """An editable install maps only the product's packages; ``sakura bench ...`` loads the checkout's tools."""
    assert PYPROJECT["project"]["scripts"]["sakura"] == "sakura_core.cli:main"
    out, _ = _sakura(REPO, ["bench", "results", "--help"])
    assert "usage: sakura bench results" in out
    assert out.strip().splitlines()[-1] == f"EXIT 0 {REPO / 'sakura_tools' / '__init__.py'}"


def test_an_installed_copy_without_the_tools_says_how_to_get_them(tmp_path):
    """A wheel's sakura_core (no sakura_tools beside it): a bench command exits 2 naming the fix; the rest runs."""
    import shutil

    ignore = shutil.ignore_patterns("__pycache__", "*.safetensors", "traces")
    for pkg in PRODUCT:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=ignore)
    out, err = _sakura(tmp_path, ["bench", "results", "--help"])
    assert out.strip().splitlines()[-1] == "EXIT 2 None"
    assert "sakura bench results: this is a developer command" in err
    assert "pip install -e ." in err and "git clone https://github.com/sakura-kv/sakura-kv" in err
    out, _ = _sakura(tmp_path, ["traces", "synth", "--help"])  # a product command
    assert "usage: sakura traces synth" in out and out.strip().splitlines()[-1] == "EXIT 0 None"


def _comfyignore() -> list[str]:
    lines = [ln.split("#", 1)[0].strip() for ln in (REPO / ".comfyignore").read_text().splitlines()]
    return [ln for ln in lines if ln]


@pytest.mark.slow
def test_the_registry_archive_leaves_the_tools_out_and_still_loads(tmp_path):
    """The Comfy Registry archive (the tracked files less ``.comfyignore``) has no ``sakura_tools``; the pack
    registers its nodes without it."""
    import shutil

    assert "sakura_tools/" in _comfyignore()
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from comfyui_manager_install import copy_pack
    finally:
        sys.path.remove(str(REPO / "tests"))
    pack = copy_pack(tmp_path / "sakura-kv")
    for pattern in _comfyignore():
        shutil.rmtree(pack / pattern.strip("/"))
    assert not (pack / "sakura_tools").exists() and (pack / "sakura_core").is_dir()
    out = _load(pack, NOT_INSTALLED.format(repo=str(REPO)))
    assert out.startswith("LOADED ['WEB_DIRECTORY', 'comfy_entrypoint']"), out
    assert out.endswith(str(pack / "sakura_core" / "__init__.py"))
