"""Skips for dependencies CI installs: outside CI a missing one skips with its reason; with ``CI=true`` it fails.

CI is a fresh machine running ``.ci/run``, which installs every dependency the tests use (the Makefile's pip extras
``test,npu,phone,cloud``; apt's ``nginx-light``, ``iproute2`` and Ceph's radosgw) and exports ``CI=true``. There a
skip for one of them would turn a regression (a package that stopped installing, a tool no longer found) into a
quiet pass, so :func:`require_or_skip` fails the test instead. Outside CI the test skips and ``-ra`` prints the reason.

What CI cannot install skips everywhere with its reason through ``pytest.skip`` itself: ComfyUI and Chromium (no
package index serves ComfyUI), root and the kernel's network namespaces. ``tests/test_ci_skips.py`` keeps that list.
This folder is on ``sys.path`` through ``pythonpath`` in pyproject.toml's pytest settings.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
from types import ModuleType

import pytest

__all__ = ["QNN_WHEELS", "import_or_skip", "in_ci", "require_or_skip"]

# pyproject.toml's marker for onnxruntime-qnn: its wheels exist for linux x86-64 and Windows only
QNN_WHEELS = (sys.platform == "linux" and platform.machine() == "x86_64") or sys.platform == "win32"


def in_ci() -> bool:
    """True when ``$CI`` says so (``true``/``1``/``yes``, any case), as CI services and ``.ci/run`` set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_or_skip(ok: object, reason: str, *, ci_installs: bool = True, allow_module_level: bool = False) -> None:
    """Nothing when ``ok``; else skip with ``reason`` — or, with ``CI=true`` and ``ci_installs``, fail with it.

    ``ci_installs``: False where CI does not install the dependency on this platform (e.g. ``QNN_WHEELS``).
    """
    if ok:
        return
    if ci_installs and in_ci():
        pytest.fail(
            f"CI=true and {reason}: CI installs this dependency (.ci/run, the Makefile), so this test must run "
            "there, not skip",
            pytrace=False,
        )
    pytest.skip(reason, allow_module_level=allow_module_level)


def import_or_skip(name: str, reason: str, *, ci_installs: bool = True) -> ModuleType:
    """``import name``; when that fails, :func:`require_or_skip` with ``reason`` and the import error."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require_or_skip(False, f"{reason} ({e})", ci_installs=ci_installs, allow_module_level=True)
        raise  # not reached: require_or_skip raised
