"""The page's fetch policies decide like Python's: every recorded call of ``on-device``, ``fetch-fp16`` and ``sakura``
(``policy_vectors.py``: simulated edits over synthetic links, single and per-step KV, three profiles, and the Python
policy tests' situations) replayed through ``phone_web/src/policy`` under node gives the same level, defer, split,
recompute, upgrade, re-root chain and reason (text and code); every reason code is present; the page's estimator seeded with the
same transfers before the lanes and fed the same observations estimates the same, and its numbers read as Python's ``:.2f`` (exact ties included); a changed rule constant in the page
or a changed recorded decision fails."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ci_deps import require_or_skip

from .policy_vectors import VECTORS_FILE, write_policy_vectors

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "phone_web"
NODE = shutil.which("node")
# every rule a decision can come from: choose's reasons, the template rules, the late-shard race, upgrades
CODES = {
    "never-fetches",
    "fp16-exact",
    "fp16-nearest",
    "probe",
    "probe-waits",
    "past-compute",
    "defer",
    "later-first",
    "floor",
    "target",
    "always-keep",
    "never-keep",
    "cannot-pay",
    "plan-keeps",
    "regret",
    "outage",
    "drop",
    "wait",
    "recompute",
    "upgrade",
    "no-upgrade",
    "worth-asking",
    "reroot",
    "no-reroot",
}


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[Path, dict]:
    require_or_skip(NODE is not None, "node is not installed (apt-get install nodejs npm)")
    out = tmp_path_factory.mktemp("policy")
    return out, write_policy_vectors(out)


def _run(vector_dir: Path, *extra: str) -> tuple[int, dict, list[dict]]:
    proc = subprocess.run(
        [NODE, str(WEB / "test" / "run_policy.mjs"), str(vector_dir), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=WEB,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines and "summary" in lines[-1], f"runner printed no summary: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    return proc.returncode, lines[-1]["summary"], lines[:-1]


def test_the_page_policy_decides_like_python_on_every_recorded_case(vectors):
    folder, counts = vectors
    rc, summary, diffs = _run(folder)
    assert counts["cases"] >= 500
    assert counts["estimator_seeds"] >= 4  # the page's estimator seeded by transfers before the lanes, as Python's
    want = counts["cases"] + counts["estimator_observations"] + counts["estimator_seeds"] + counts["formats"]
    assert summary["cases"] == want
    assert rc == 0 and summary["pass"] == summary["cases"], diffs[:5]
    assert set(counts["codes"]) == CODES, (
        f"missing {CODES - set(counts['codes'])}, unknown {set(counts['codes']) - CODES}"
    )
    assert set(counts["policies"]) == {"sakura", "on-device", "fetch-fp16"}


@pytest.mark.parametrize(
    "perturb", [{"late_patience": 0.3}, {"regret_slowdown": 1.5}, {"stall_budget": 0.02}, {"later_first_from": 1}]
)
def test_a_changed_rule_constant_in_the_page_fails_the_suite(vectors, perturb):
    rc, summary, diffs = _run(vectors[0], "--perturb", json.dumps(perturb))
    assert rc == 1 and summary["pass"] < summary["cases"] and diffs


def test_a_changed_recorded_decision_fails_the_suite(vectors, tmp_path):
    data = json.loads((vectors[0] / VECTORS_FILE).read_text(encoding="utf-8"))
    case = next(c for s in data["sequences"] for c in s["cases"] if c["want"]["code"] == "floor")
    case["want"]["reason"] = case["want"]["reason"].replace("t=", "t=1", 1)  # one digit of a predicted finish
    (tmp_path / VECTORS_FILE).write_text(json.dumps(data), encoding="utf-8")
    rc, summary, diffs = _run(tmp_path)
    assert rc == 1 and summary["pass"] == summary["cases"] - 1 and len(diffs) == 1 and diffs[0]["call"] == "choose"
