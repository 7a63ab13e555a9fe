"""Fixtures of the node tests: the stand-in ComfyUI modules (on ``sys.path`` only while these tests run), the repo
root loaded as a custom-node package the way ComfyUI loads it, a store with a demo template, a real ``sakura serve``
and a real (emulated) phone agent."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STUBS = HERE / "stubs"
PACKAGE = "sakura_custom_node"  # the name the repo root is loaded under (ComfyUI uses the folder's path)
STUB_MODULES = ("comfy", "comfy_api", "folder_paths", "server")
PHONE_TOKEN = "phone-pairing-token-01"
TEMPLATE = "face-swap-astronaut"
PROMPT = "place it in the marked region"


def _load_file(name: str, path: Path, package: bool = False):
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(path.parent)] if package else None
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _drop_modules(prefixes: tuple[str, ...]) -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in prefixes:
            del sys.modules[name]


@pytest.fixture(scope="module")
def comfy():
    """The stand-in ComfyUI modules and the Sakura node package loaded through the root ``__init__`` (per test
    module, so the stand-ins are importable only while the node tests run)."""
    sys.path.insert(0, str(STUBS))
    try:
        pkg = _load_file(PACKAGE, REPO / "__init__.py", package=True)
        import comfy.model_management
        import comfy.utils
        import folder_paths
        from comfy_api.latest import io

        yield SimpleNamespace(
            package=pkg,
            nodes=sys.modules[f"{PACKAGE}.nodes"],
            io=io,
            utils=comfy.utils,
            mm=comfy.model_management,
            folder_paths=folder_paths,
        )
    finally:
        sys.path.remove(str(STUBS))
        _drop_modules((*STUB_MODULES, PACKAGE))


@pytest.fixture(scope="module")
def node_classes(comfy):
    import asyncio

    extension = asyncio.run(comfy.package.comfy_entrypoint())
    classes = asyncio.run(extension.get_node_list())
    return {cls.define_schema().node_id: cls for cls in classes}


@pytest.fixture
def run_node(comfy):
    """``run_node(cls, **inputs)`` -> the node's outputs, executed as ComfyUI does (a clone with hidden inputs)."""

    def run(cls, **inputs):
        clone = cls.PREPARE_CLASS_CLONE({comfy.io.Hidden.unique_id: "7"})
        return clone.execute(**inputs).args

    return run


@pytest.fixture
def flow(run_node, node_classes):
    """The node chain with defaults: ``load_template(model, **inputs)``, ``make_stream(template, ...)``,
    ``sample(model, stream, image, ...)``."""

    def load_template(model, **overrides):
        inputs = dict(model=model, template_id=TEMPLATE, source="server", server_url="", token="", store_dir="")
        inputs.update(overrides)
        (template,) = run_node(node_classes["SakuraTemplateLoader"], **inputs)
        return template

    def make_stream(template, policy="sakura", bandwidth="live", mbit=20.0):
        (stream,) = run_node(
            node_classes["SakuraAdaptiveFetch"],
            template=template,
            policy=policy,
            bandwidth=bandwidth,
            fixed_mbit_s=mbit,
            trace="norway_bus_1",
            trace_path="",
        )
        return stream

    def sample(
        model,
        stream,
        image,
        steps=3,
        seed=0,
        device=None,
        save_prefix="",
        device_timing="this machine (measured)",
        prompt=PROMPT,
    ):
        return run_node(
            node_classes["SakuraPipelinedSampler"],
            model=model,
            kv_stream=stream,
            image=image,
            prompt=prompt,
            steps=steps,
            seed=seed,
            save_prefix=save_prefix,
            device_timing=device_timing,
            device=device,
        )

    return SimpleNamespace(
        load_template=load_template, make_stream=make_stream, sample=sample, template=TEMPLATE, prompt=PROMPT
    )


@pytest.fixture
def progress(comfy):
    """Records every progress-bar update; ``interrupt_at`` (layers) raises ComfyUI's interrupt flag there."""
    state = SimpleNamespace(updates=[], interrupt_at=None)

    def hook(value, total, preview, node_id=None):
        state.updates.append((value, total, node_id))
        if state.interrupt_at is not None and value >= state.interrupt_at:
            comfy.mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    try:
        yield state
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
        comfy.mm.interrupt_current_processing(False)


@pytest.fixture(scope="session")
def workflow_defs():
    """``tests/nodes/workflows.py`` as a module: the example workflows' definitions (``WORKFLOWS``), the test-only ones
    (``TEST_WORKFLOWS``) and ``render``."""
    return _load_file("sakura_workflows", HERE / "workflows.py")


@pytest.fixture(scope="session")
def examples():
    from cloud_server import examples

    return examples


@pytest.fixture(scope="session")
def user_uint8(examples):
    """The private user image of the face-swap example, (128, 128, 3) uint8."""
    return examples.user_image("sakura-face.png")


@pytest.fixture(scope="session")
def user(user_uint8):
    """The same as a ComfyUI IMAGE (1, H, W, 3) float in [0, 1]."""
    import numpy as np
    import torch

    return torch.from_numpy(user_uint8.astype(np.float32) / 255.0).unsqueeze(0)


@pytest.fixture(scope="session")
def phone_token():
    return PHONE_TOKEN


@pytest.fixture(scope="session")
def demo_model():
    from sakura_core.models.edit_model import load_demo_model

    return load_demo_model()


@pytest.fixture(scope="session")
def store_dir(tmp_path_factory, examples, demo_model):
    """A local store with the face-swap example template (more are added by the tests that need them)."""
    root = tmp_path_factory.mktemp("sakura-store")
    # full: the fetch-fp16 tests compare the node's edit with the exact-KV edit
    examples.publish_examples(root, demo_model, ["face-swap-astronaut"], store_profile="full")
    return root


def free_port() -> int:
    """A loopback port nothing listens on (just closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_process(argv: list[str], pattern: str, what: str, timeout_s: float = 120.0, cwd: Path = REPO, env=None):
    """Start ``argv``, wait for a stdout line matching ``pattern`` (group 1 = URL); keep draining its output."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    found: dict[str, str] = {}
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        for line in proc.stdout:
            lines.append(line)
            m = re.search(pattern, line)
            if m and not ready.is_set():
                found["url"] = m.group(1).rstrip("/")
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            break
    if "url" not in found:
        proc.kill()
        proc.wait(timeout=30)
        raise RuntimeError(f"{what} did not start: {''.join(lines[-20:])}")
    return proc, found["url"], lines


def manager_install_module():
    """``tests/comfyui_manager_install.py`` as a module (the script that installs the pack as ComfyUI-Manager does)."""
    name = "sakura_comfyui_manager_install"
    if name not in sys.modules:
        _load_file(name, REPO / "tests" / "comfyui_manager_install.py")
    return sys.modules[name]


@pytest.fixture(scope="session")
def comfyui_python(tmp_path_factory) -> str:
    """The Python real ComfyUI runs with: ``$COMFYUI_PYTHON`` (default this one) when it has the pack's
    requirements, else a fresh venv layered on it with ``requirements.txt`` installed as ComfyUI-Manager does."""
    import os

    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    mgr = manager_install_module()
    if not mgr._missing(Path(python), mgr._requirement_names(REPO / "requirements.txt")):
        return python
    work = tmp_path_factory.mktemp("comfyui-venv")
    layered = mgr.layered_venv(python, work / "venv")
    mgr.manager_install(layered, REPO, python, work)
    return str(layered)


def start_comfyui(comfyui_dir: str, base: Path, examples, env: dict | None = None, python: str | None = None):
    """A real ComfyUI (``comfyui_dir``, Python ``python``, default ``$COMFYUI_PYTHON``) on a free loopback port with
    ``--base-directory`` ``base``: ``custom_nodes/sakura`` -> this repo, ``input/`` with the example user images.
    Returns (proc, url, log)."""
    import os

    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "sakura").symlink_to(REPO, target_is_directory=True)
    (base / "models" / "diffusers").mkdir(parents=True)
    examples.write_user_images(base / "input")
    python = python or os.environ.get("COMFYUI_PYTHON", sys.executable)
    argv = [
        python,
        "main.py",
        "--cpu",
        "--listen",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--base-directory",
        str(base),
        "--database-url",
        "sqlite:///:memory:",
        "--disable-auto-launch",
        "--log-stdout",
    ]
    full_env = {**os.environ, **(env or {})}
    return start_process(argv, r"To see the GUI go to: (http://\S+)", "ComfyUI", 300, Path(comfyui_dir), full_env)


def stop_process(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def server_url(store_dir):
    """A real ``sakura serve`` over the store, on a free loopback port."""
    argv = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "serve",
        "--store",
        str(store_dir),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        "demo",
    ]
    proc, url, _ = start_process(argv, r"serving (http://\S+)", "sakura serve")
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def phone_url():
    """A real phone agent (the emulated phone: this host's CPU) on a free loopback port."""
    argv = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "phone-agent",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--token",
        PHONE_TOKEN,
    ]
    proc, url, _ = start_process(argv, r"listening on (http://\S+)", "sakura phone-agent")
    try:
        yield url
    finally:
        stop_process(proc)
