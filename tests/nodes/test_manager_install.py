"""The pack installed as ComfyUI-Manager installs it (a copy in ``custom_nodes/`` + ``pip install -r
requirements.txt``, nothing else) into a fresh venv layered on a real ComfyUI's: its seven nodes are in
``/object_info`` (``tests/comfyui_manager_install.py`` does the work; DEVELOPERS.md says how to set it up)."""

from __future__ import annotations

import os

import pytest

from .conftest import manager_install_module

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
if not COMFYUI_DIR:
    pytest.skip(
        "COMFYUI_DIR is not set: the Manager-install test needs a ComfyUI checkout (see DEVELOPERS.md)",
        allow_module_level=True,
    )


def test_a_manager_install_registers_every_sakura_node(tmp_path):
    import sys
    from pathlib import Path

    mgr = manager_install_module()
    res = mgr.run_check(Path(COMFYUI_DIR), os.environ.get("COMFYUI_PYTHON", sys.executable), tmp_path)
    assert res.ok, "\n".join(res.problems)
    assert res.nodes == sorted(mgr.NODE_IDS)
    assert res.torch_after == res.torch_before  # requirements.txt never brings a torch
    # before the install the pack said what was missing and how to fix it (a base with every requirement, as CI's,
    # has one hidden for that step: comfyui_manager_install.HIDDEN_REQUIREMENT)
    assert res.missing_before, "nothing was missing before the install: the import-error check did not run"
    assert "pip install -r" in res.import_error_before and res.missing_before[0] in res.import_error_before
