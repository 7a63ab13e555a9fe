"""Install the node pack as ComfyUI-Manager does and check that ComfyUI registers its seven nodes.

ComfyUI-Manager (and a Comfy Registry install) puts the pack's folder into ``custom_nodes/`` and runs ``pip install
-r requirements.txt`` in it with ComfyUI's Python (then ``install.py`` if there is one); nothing else. This script
does exactly that against a real ComfyUI checkout, without touching the ComfyUI installation it is given:

1. a fresh virtual environment layered on ComfyUI's (``--base-python``): a ``.pth`` file puts the base
   environment's site-packages after the fresh one's, so ComfyUI's torch and requirements are there and whatever
   the pack's requirements add lands in the fresh environment (a constraints file of the base's versions keeps pip
   from changing any of them; the script checks that no torch was installed);
2. a copy of this working tree (tracked and untracked, not ignored files: what a clone holds) as
   ``custom_nodes/sakura-kv`` of a temporary ``--base-directory``;
3. ComfyUI started before the install: the pack must fail to import with a message naming a missing package and the
   ``pip install -r`` command (a base that has every requirement, as CI's after its own install, gets one hidden for
   this step: a ``.pth`` refusing ``import`` of :data:`HIDDEN_REQUIREMENT`, deleted after it);
4. ``pip install -r requirements.txt`` (cwd = the pack), ``install.py`` if present;
5. ComfyUI started again on 127.0.0.1: ``/object_info`` must list the seven Sakura nodes from that folder.

    python tests/comfyui_manager_install.py --comfyui "$COMFYUI_DIR" --base-python "$COMFYUI_PYTHON"

``--comfyui`` and ``--base-python`` default to the environment variables ``COMFYUI_DIR`` and ``COMFYUI_PYTHON``
(as the pytest wrapper uses them; DEVELOPERS.md sets them up); ``--work`` defaults to a temporary folder.

Prints what it did and exits 1 on a failed check. ``tests/nodes/test_manager_install.py`` runs it under pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NODE_IDS", "InstallResult", "copy_pack", "layered_venv", "main", "manager_install", "run_check"]

REPO = Path(__file__).resolve().parents[1]
NODE_IDS = (
    "SakuraModelLoader",
    "SakuraTemplateLoader",
    "SakuraAdaptiveFetch",
    "SakuraPipelinedSampler",
    "SakuraPhoneDevice",
    "SakuraTemplateKV",
    "SakuraTemplateKVReport",
)
PACK = "sakura-kv"  # the folder name a clone of the repository gets
START_TIMEOUT_S = 300.0


@dataclass
class InstallResult:
    """What the check saw. ``ok`` when every check passed; ``problems`` says which did not."""

    python: str = ""
    pack_dir: str = ""
    missing_before: list[str] = field(default_factory=list)
    import_error_before: str = ""
    installed: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    python_modules: list[str] = field(default_factory=list)
    torch_before: str = ""
    torch_after: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _run(argv: list, cwd: Path | None = None, timeout_s: float = 900.0) -> str:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def _py(python: Path | str, code: str) -> str:
    return _run([python, "-c", code]).strip()


def layered_venv(base_python: str, dest: Path) -> Path:
    """A fresh venv at ``dest`` that also sees ``base_python``'s site-packages (after its own); its python."""
    _run([base_python, "-m", "venv", dest])
    python = dest / "bin" / "python"
    base_site = _py(base_python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    own_site = Path(_py(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    (own_site / "zz-comfyui-base.pth").write_text(base_site + "\n")
    return python


def copy_pack(dest: Path) -> Path:
    """This working tree's files as a clone has them (tracked + untracked, not ignored), at ``dest``."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO)
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _requirement_names(requirements: Path) -> list[str]:
    names = []
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0])
    return names


def _missing(python: Path, names: list[str]) -> list[str]:
    code = (
        "import importlib.metadata as m, json, sys\nout = []\nfor n in sys.argv[1:]:\n    try: m.version(n)\n"
        "    except m.PackageNotFoundError: out.append(n)\nprint(json.dumps(out))"
    )
    return json.loads(_run([python, "-c", code, *names]).strip())


def manager_install(python: Path, pack: Path, base_python: str, work: Path) -> list[str]:
    """``pip install -r requirements.txt`` in ``pack`` (+ ``install.py``), as the Manager runs it; the base's
    versions as constraints. Returns the distributions pip installed."""
    frozen = _run([base_python, "-m", "pip", "freeze", "--exclude-editable"])
    constraints = work / "base-constraints.txt"
    constraints.write_text("\n".join(ln for ln in frozen.splitlines() if "==" in ln and " @ " not in ln) + "\n")
    out = _run([python, "-m", "pip", "install", "-r", "requirements.txt", "-c", constraints], cwd=pack)
    if (pack / "install.py").is_file():
        _run([python, "install.py"], cwd=pack)
    done = [ln for ln in out.splitlines() if ln.startswith("Successfully installed")]
    return done[0].split()[2:] if done else []


def _start(comfyui: Path, python: Path, base: Path, port: int) -> tuple[subprocess.Popen, list[str]]:
    argv = [
        python,
        "main.py",
        "--cpu",
        "--listen",
        "127.0.0.1",
        "--port",
        str(port),
        "--base-directory",
        base,
        "--database-url",
        "sqlite:///:memory:",
        "--disable-auto-launch",
        "--log-stdout",
    ]
    log: list[str] = []
    proc = subprocess.Popen(
        [str(a) for a in argv], cwd=comfyui, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            log.append(line)
            if "To see the GUI go to" in line:
                return proc, log
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"ComfyUI did not start within {START_TIMEOUT_S:.0f} s:\n{''.join(log[-40:])}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _object_info(comfyui: Path, python: Path, base: Path) -> tuple[dict, str]:
    port = _free_port()
    proc, log = _start(comfyui, python, base, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/object_info", timeout=60) as resp:
            info = json.loads(resp.read())
        time.sleep(0.5)
        assert proc.stdout is not None
        log.extend(proc.stdout.readlines())
    finally:
        _stop(proc)
    return info, "".join(log)


#: the requirement hidden from a base that has them all, so that the pack's missing-requirement error is still seen
HIDDEN_REQUIREMENT = "zstandard"


def _hide_module(python: Path, name: str) -> Path:
    """Make ``import name`` fail in the venv of ``python`` (a ``.pth`` that puts a refusing finder first on
    ``sys.meta_path``), as if the package were not installed; returns the ``.pth`` to delete to undo it."""
    own_site = Path(_py(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    hook = own_site / "zz-sakura-hide.pth"
    hook.write_text(
        "import sys; sys.meta_path.insert(0, type('Hide', (), {'find_spec': staticmethod(lambda n, *a, **k: "
        "(_ for _ in ()).throw(ModuleNotFoundError('No module named ' + repr(n), name=n)) "
        f"if n.split('.')[0] == {name!r} else None)}})())\n"
    )
    return hook


def run_check(comfyui: Path, base_python: str, work: Path) -> InstallResult:
    """Steps 1-5 of the module doc in ``work``; the result says what was seen."""
    res = InstallResult()
    python = layered_venv(base_python, work / "venv")
    res.python = str(python)
    base = work / "comfyui-base"
    pack = copy_pack(base / "custom_nodes" / PACK)
    res.pack_dir = str(pack)
    (base / "input").mkdir(parents=True, exist_ok=True)
    torch_version = "import torch; print(torch.__version__, torch.__file__)"
    res.torch_before = _py(python, torch_version)
    res.missing_before = _missing(python, _requirement_names(pack / "requirements.txt"))
    hidden = None
    if not res.missing_before:  # the base has every requirement (CI installs them first): hide one for this step
        hidden = _hide_module(python, HIDDEN_REQUIREMENT)
        res.missing_before = [HIDDEN_REQUIREMENT]
    if res.missing_before:
        try:
            info, log = _object_info(comfyui, python, base)
        finally:
            if hidden is not None:
                hidden.unlink()
        m = re.search(r"SAKURA nodes not registered: [^\n]*", log)
        res.import_error_before = m.group(0) if m else ""
        if not m or "pip install -r" not in m.group(0) or str(pack / "requirements.txt") not in m.group(0):
            res.problems.append(f"before the install: no import error naming the requirements:\n{log[-3000:]}")
        if set(NODE_IDS) & set(info):
            res.problems.append("before the install the nodes registered although requirements were missing")
    res.installed = manager_install(python, pack, base_python, work)
    res.torch_after = _py(python, torch_version)
    if res.torch_after != res.torch_before or any(n.lower().startswith("torch-") for n in res.installed):
        res.problems.append(f"the install changed torch: {res.torch_before} -> {res.torch_after} ({res.installed})")
    info, log = _object_info(comfyui, python, base)
    res.nodes = sorted(n for n in NODE_IDS if n in info)
    res.python_modules = sorted({info[n]["python_module"] for n in res.nodes})
    if res.nodes != sorted(NODE_IDS):
        res.problems.append(f"/object_info lacks {sorted(set(NODE_IDS) - set(res.nodes))}:\n{log[-4000:]}")
    if not res.python_modules or not all(m.endswith(PACK) for m in res.python_modules):
        res.problems.append(f"nodes not from custom_nodes/{PACK}: {res.python_modules}")
    failed = [ln for ln in log.splitlines() if "IMPORT FAILED" in ln and PACK in ln]
    if failed:
        res.problems.append(f"ComfyUI reports the pack as IMPORT FAILED: {failed}\n{log[-4000:]}")
    if "is imported from" in log:
        res.problems.append("sakura_core came from another folder than the pack's")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    comfyui_dir, comfyui_python = os.environ.get("COMFYUI_DIR"), os.environ.get("COMFYUI_PYTHON")
    ap.add_argument(
        "--comfyui",
        default=comfyui_dir,
        required=not comfyui_dir,
        help="ComfyUI checkout (main.py); default: $COMFYUI_DIR",
    )
    ap.add_argument(
        "--base-python",
        default=comfyui_python,
        required=not comfyui_python,
        help="the Python with ComfyUI's torch and requirements; default: $COMFYUI_PYTHON",
    )
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one, removed afterwards)")
    args = ap.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="sakura-manager-install-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = run_check(Path(args.comfyui), args.base_python, work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"pack:                  {res.pack_dir}")
    print(f"missing before:        {', '.join(res.missing_before)}")
    print(f"import error before:   {res.import_error_before or '-'}")
    print(f"pip installed:         {' '.join(res.installed) or 'nothing'}")
    print(f"torch before / after:  {res.torch_before} / {res.torch_after}")
    print(f"nodes in /object_info: {', '.join(res.nodes)} ({', '.join(res.python_modules)})")
    for problem in res.problems:
        print(f"FAILED: {problem}")
    print("OK: a Manager-style install registers the 5 nodes" if res.ok else "FAILED")
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
