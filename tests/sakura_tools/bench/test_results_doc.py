"""docs/results.md's measured results are generated from committed benchmark JSON (``docs/results/``), so the
document cannot drift from what was run: every section is in it and equals its rendering, each rendering names the
command that made it, and the CI-size run of the e2e command, rerun here, reproduces its committed JSON figure for
figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sakura_core.cli import main
from sakura_tools.bench.results_doc import DOC, SECTIONS, render_section, section_paths, update_doc

ROOT = Path(__file__).resolve().parents[3]


def test_every_results_section_is_in_the_doc_and_current():
    text = (ROOT / DOC).read_text()
    for name in SECTIONS:
        assert f"<!-- results:{name} -->" in text and f"<!-- /results:{name} -->" in text, name
    assert update_doc(ROOT / DOC, ROOT, check=True) == [], "run `sakura bench results` and commit docs/results.md"


def test_a_section_renders_its_json_with_the_command():
    data = json.loads((ROOT / SECTIONS["e2e-ci"][0]).read_text())
    out = render_section("e2e-ci", ROOT)
    assert data["command"] in out
    r = data["results"][0] if "results" in data else data
    h = r["by_class"]["4G"]["headline"]["sakura_vs_oracle"]
    assert f"{h['median']:.2f} / {h['worst']:.2f}" in out


@pytest.mark.parametrize("name", list(SECTIONS))
def test_every_section_names_its_command_and_no_machine_path(name):
    out = render_section(name, ROOT)
    assert out.startswith(("Command: `", "Commands: `")), out[:200]
    assert "(command not recorded)" not in out
    assert not [p for p in ("/" + "work/", "/" + "home/", "/" + "root/") if p in out]  # a development machine's
    assert all((ROOT / p).is_file() for p in section_paths(name))


def test_the_cli_checks_and_rewrites_a_stale_section(tmp_path, capsys):
    doc = tmp_path / "results.md"
    doc.write_text("intro\n<!-- results:planner -->\nstale\n<!-- /results:planner -->\nend\n")
    args = ["--root", str(ROOT), "--doc", str(doc)]  # an absolute --doc wins over --root
    assert main(["bench", "results", *args, "--check"]) == 1
    assert "stale sections" in capsys.readouterr().out
    assert main(["bench", "results", *args]) == 0
    assert render_section("planner", ROOT) in doc.read_text() and doc.read_text().startswith("intro\n")
    assert main(["bench", "readme", *args, "--check"]) == 0  # the old name still runs it


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


def test_the_readme_results_table_is_current():
    """The README quotes one generated section (the headline); it is rendered from the same JSON."""
    text = (ROOT / "README.md").read_text()
    assert "<!-- results:headline -->" in text
    assert update_doc(ROOT / "README.md", ROOT, check=True) == [], "run `sakura bench results`"


def test_one_command_rewrites_every_document_with_generated_tables(tmp_path, capsys):
    """`sakura bench results` (no --doc) regenerates docs/results.md and the README together (issue 50: the README's
    table went stale while docs/results.md was current)."""
    import shutil

    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "docs/results", tmp_path / "docs/results")
    stale = "<!-- results:planner -->\nold rows\n<!-- /results:planner -->\n"
    for name in ("docs/results.md", "README.md"):
        (tmp_path / name).write_text(f"# {name}\n{stale}")
    assert main(["bench", "results", "--root", str(tmp_path), "--check"]) == 1
    assert "docs/results.md: planner; README.md: planner" in capsys.readouterr().out
    assert main(["bench", "results", "--root", str(tmp_path)]) == 0
    for name in ("docs/results.md", "README.md"):
        assert render_section("planner", ROOT) in (tmp_path / name).read_text()
    assert main(["bench", "results", "--root", str(tmp_path), "--check"]) == 0


def test_the_headline_reports_cachegen_held_to_the_floor_and_the_old_rule_beside_it():
    from sakura_tools.bench.e2e_tables import headline_table

    data = json.loads((ROOT / SECTIONS["e2e-ci"][0]).read_text())  # per-step klein cpu, with cachegen-no-floor
    out = headline_table(data, classes=("3G", "4G"))
    row = next(line for line in out.splitlines() if line.startswith("| cachegen (no floor)"))
    assert "reported once" in row
    cg = data["by_class"]["4G"]["summary"]
    assert cg["cachegen"]["median_psnr_db"] >= 35.0 > cg["cachegen-no-floor"]["median_psnr_db"]  # old: 29.2 dB
    assert "cachegen (no floor) 100.0 / 29.2 dB" in out  # 3G: it recomputes too
    assert "held to sakura's 35 dB floor" in out
