"""``sakura bench listing`` at a tiny size: its manifests pass the schema, every count is served with each listing
complete, and the JSON holds the rows the table printed."""

from __future__ import annotations

import json

import pytest

from sakura_core.cli import main
from sakura_core.kv.manifest import parse_manifest
from sakura_tools.infra.bench_listing import synthetic_manifest


def test_synthetic_manifests_pass_the_schema_and_differ_by_salt():
    m = synthetic_manifest("tpl-00001", 3, 4)
    assert parse_manifest(m, template_id="tpl-00001").num_layers == 3
    assert m["shards"][0]["representations"][2]["requires"] == [
        r["digest"] for r in m["shards"][0]["representations"][:2]
    ]
    assert synthetic_manifest("tpl-00001", 3, 4, "x") != m


def test_bench_listing_serves_every_count_and_writes_its_json(tmp_path, capsys):
    out = tmp_path / "listing.json"
    argv = [
        "bench",
        "listing",
        "--json",
        str(out),
        "--counts",
        "2,5",
        "--layers",
        "2",
        "--levels",
        "2",
        "--repeats",
        "2",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["server"], r["templates"]) for r in rows] == [("this", 2), ("this", 5)]
    for r in rows:
        assert r["page_s"] is not None and r["rss_mib"] > 0 and r["healthz_during_cold_n"] >= 0
        assert f"this     {r['templates']:>9}" in printed
    assert f"wrote {out}" in printed


@pytest.mark.parametrize("argv", [["--counts", "0"], ["--levels", "1"], ["--compare-with", "/nonexistent-checkout"]])
def test_bench_listing_refuses_bad_flags(tmp_path, argv, capsys):
    assert main(["bench", "listing", "--json", str(tmp_path / "x.json"), *argv]) == 2
    assert "sakura bench listing:" in capsys.readouterr().err
