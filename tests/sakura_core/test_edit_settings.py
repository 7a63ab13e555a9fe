"""The edit's one settings object (``sakura_core.edit_settings``): each value checked once, where it enters; the
policy name checked in one place only (a second check coming back fails here, by a count of the call sites and by
a counter on the one check)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sakura_core import edit_settings
from sakura_core.edit_settings import EditSettings, FetchSettings
from sakura_core.fetch.link import LinkSpec

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("sakura_core", "cloud_server", "android_bridge", "nodes", "sakura_tools")


def _calls_of(name: str) -> list[str]:
    """``path:line`` of every call of ``name`` (``name(...)`` or ``x.name(...)``) in the product's modules."""
    out = []
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if called == name:
                        out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_the_policy_name_is_checked_in_one_place():
    calls = _calls_of("runnable_policy")
    assert len(calls) == 1 and calls[0].startswith("sakura_core/edit_settings.py:"), calls


@pytest.fixture
def policy_checks(monkeypatch) -> list[str]:
    """The policy names the one check saw (a counter on ``edit_settings.runnable_policy``)."""
    seen: list[str] = []
    real = edit_settings.runnable_policy

    def counted(name: str) -> str:
        seen.append(name)
        return real(name)

    monkeypatch.setattr(edit_settings, "runnable_policy", counted)
    return seen


def test_one_edit_checks_its_policy_once(policy_checks):
    """The node's way (fetch settings first, the sampler's prompt, steps and seed later) and the phone agent's (a job
    header) each check the policy name once."""
    from android_bridge.wire import edit_request_from_header

    fetch = FetchSettings("fetch-fp16", LinkSpec.fixed(40), latency_target_s=2.0)
    settings = EditSettings("place it", 3, 5, fetch)
    assert policy_checks == ["fetch-fp16"]
    assert (settings.policy, settings.link, settings.latency_target_s) == ("fetch-fp16", LinkSpec.fixed(40), 2.0)
    policy_checks.clear()
    job = {"template_id": "tpl", "cloud_url": "http://127.0.0.1:9", "prompt": "p", "policy": "sakura", "steps": 2}
    request = edit_request_from_header(job)
    assert policy_checks == ["sakura"] and request.settings.steps == 2 and request.source.url == "http://127.0.0.1:9"


def test_each_value_is_refused_with_its_name():
    with pytest.raises(ValueError, match="policy 'free-kv' cannot run an edit; choose one of .*sakura"):
        FetchSettings("free-kv")
    with pytest.raises(ValueError, match="'fixed:x'"):
        FetchSettings(link="fixed:x")  # the string form is parsed, once, here
    with pytest.raises(ValueError, match="latency_target_s must be > 0 seconds or None, got -1"):
        FetchSettings(latency_target_s=-1)
    with pytest.raises(ValueError, match="lone surrogate"):
        EditSettings("swap \ud83d")
    with pytest.raises(ValueError, match="seed must be an integer, got '7'"):
        EditSettings("p", seed="7")
    with pytest.raises(ValueError, match=r"seed must be in 0..2\*\*63-1, got 9223372036854775808"):
        EditSettings("p", seed=2**63)
    with pytest.raises(ValueError, match="fetch must be a FetchSettings"):
        EditSettings("p", fetch="sakura")
    assert EditSettings("p").fetch == FetchSettings() and EditSettings("p").link == LinkSpec.live()
