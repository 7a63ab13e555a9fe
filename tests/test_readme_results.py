"""The README's measured results are generated from committed benchmark JSON (``docs/results/``), so the document
cannot drift from what was run: every marked section equals its rendering, and the CI-size run of the e2e
command, rerun here, reproduces its committed JSON figure for figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sakura_core.bench.readme import SECTIONS, render_section, update_readme

ROOT = Path(__file__).resolve().parents[1]


def test_every_results_section_is_in_the_readme_and_current():
    text = (ROOT / "README.md").read_text()
    for name in SECTIONS:
        assert f"<!-- results:{name} -->" in text and f"<!-- /results:{name} -->" in text, name
    assert update_readme(ROOT / "README.md", ROOT, check=True) == [], "run `sakura bench readme` and commit"


def test_a_section_renders_its_json_with_the_command():
    data = json.loads((ROOT / SECTIONS["e2e-ci"][0]).read_text())
    out = render_section("e2e-ci", ROOT)
    assert data["command"] in out
    r = data["results"][0] if "results" in data else data
    h = r["by_class"]["4G"]["headline"]["sakura_vs_oracle"]
    assert f"{h['median']:.2f} / {h['worst']:.2f}" in out


def _flat(prefix: tuple, val, out: dict) -> None:
    if isinstance(val, dict):
        for k, v in val.items():
            _flat((*prefix, k), v, out)
    else:
        out[prefix] = val


def _figures(data: dict) -> dict:
    """Every headline figure of every result and class, and every policy's median latency."""
    out: dict = {}
    for r in data["results"] if "results" in data else [data]:
        for cls, part in r["by_class"].items():
            key = (r["kv_mode"], r["geometry"], r["profile"], cls)
            _flat(key, part["headline"], out)
            _flat(key, {p: s["median_latency_s"] for p, s in part["summary"].items()}, out)
    return out


@pytest.mark.slow
def test_the_ci_run_reproduces_its_committed_json(tmp_path, monkeypatch):
    from sakura_core.cli import main

    committed = json.loads((ROOT / SECTIONS["e2e-ci"][0]).read_text())
    argv = committed["argv"]
    assert "--planning" in argv and argv[argv.index("--planning") + 1] not in ("measured",)  # deterministic
    monkeypatch.chdir(ROOT)  # the command's paths are relative to the repository root
    out = tmp_path / "ci.json"
    assert main(["bench", "e2e", *argv, "--json", str(out)]) == 0
    new, old = _figures(json.loads(out.read_text())), _figures(committed)
    assert new.keys() == old.keys()
    for key, val in old.items():
        assert new[key] == (val if val is None else pytest.approx(val, rel=1e-9, abs=1e-9)), key
