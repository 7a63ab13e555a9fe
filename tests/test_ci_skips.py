"""No silent skip in CI: a test whose dependency CI installs skips through ``ci_deps.require_or_skip`` (which fails
with ``CI=true``); only what CI cannot install skips with plain ``pytest.skip``, in the files listed here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ci_deps import import_or_skip, in_ci, require_or_skip

TESTS = Path(__file__).resolve().parent
# files that may skip with pytest itself, and why CI cannot provide what they need
PLAIN_SKIPS = {
    "nodes/test_real_comfyui.py": "ComfyUI: no package index serves it (COMFYUI_DIR)",
    "nodes/test_comfyui_frontend.py": "ComfyUI and a Chromium for its frontend (COMFYUI_DIR, CHROMIUM)",
    "nodes/test_manager_install.py": "ComfyUI: no package index serves it (COMFYUI_DIR)",
    "sakura_core/models/test_loading.py": "not a missing dependency: a machine with CUDA has no CUDA error to refuse",
    "nodes/test_klein_files.py": "not a missing dependency: a machine with a GPU has no CUDA error to refuse",
    "sakura_tools/infra/test_netns.py": "root and a kernel that lets us create network namespaces",
    "cloud_server/test_cli_disk_faults.py": "not a dependency: a real full disk needs root and a kernel that lets us "
    "mount a tmpfs in a private mount namespace",
    "manifest_fuzz.py": "not a dependency: the fuzz's RSS bound reads Linux's /proc/self/statm",
    "readonly.py": "not a dependency: as root a folder is read-only only by chattr +i, which some file systems refuse",
    "phone_web/test_browser.py": "Chromium: CI installs no browser (the decoders' node tests run there)",
    "support/ci_deps.py": "the helper itself",
}
SKIP = re.compile(r"\bskip\(|importorskip\(|mark\.skip(if)?\b|\bxfail\b")  # not require_or_skip(


def test_only_the_listed_files_skip_with_pytest_itself():
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS).as_posix()
        if rel.startswith("nodes/stubs/") or rel == "test_ci_skips.py":
            continue
        lines = [n for n, line in enumerate(path.read_text().splitlines(), 1) if SKIP.search(line)]
        if lines:
            found[rel] = lines
    unexpected = {rel: lines for rel, lines in found.items() if rel not in PLAIN_SKIPS}
    assert not unexpected, (
        f"plain pytest skips at {unexpected}: use ci_deps.require_or_skip / import_or_skip (they fail with CI=true), "
        "or add the file to PLAIN_SKIPS with the reason CI cannot install its dependency"
    )
    assert set(found) == set(PLAIN_SKIPS), f"stale PLAIN_SKIPS entries: {sorted(set(PLAIN_SKIPS) - set(found))}"


def _outcome(fn, *args, **kwargs) -> tuple[str, str]:
    """What a call does to the test: ("fail" | "skip", message) or ("none", "") — caught here, so a skip cannot
    escape and turn this test itself into a skip."""
    try:
        fn(*args, **kwargs)
    except pytest.fail.Exception as e:
        return "fail", str(e)
    except pytest.skip.Exception as e:
        return "skip", str(e)
    return "none", ""


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_a_missing_dependency_fails_with_ci_set(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    assert in_ci()
    kind, why = _outcome(require_or_skip, False, "nginx is missing")
    assert kind == "fail" and why.startswith("CI=true and nginx is missing: CI installs this dependency")
    kind, why = _outcome(import_or_skip, "no_such_module_here", "a package CI installs")
    assert kind == "fail" and "a package CI installs (No module named 'no_such_module_here')" in why
    # CI does not install it on this platform: a skip, in CI too
    assert _outcome(require_or_skip, False, "no wheel here", ci_installs=False) == ("skip", "no wheel here")
    assert _outcome(require_or_skip, True, "present") == ("none", "")


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_a_missing_dependency_skips_outside_ci(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    assert _outcome(require_or_skip, False, "nginx is missing") == ("skip", "nginx is missing")
    kind, why = _outcome(import_or_skip, "no_such_module_here", "a package CI installs")
    assert kind == "skip" and why.startswith("a package CI installs (No module named")
    assert import_or_skip("json", "stdlib").dumps([1]) == "[1]"
