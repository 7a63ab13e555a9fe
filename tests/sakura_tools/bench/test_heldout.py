"""``sakura bench heldout``: it measures what a manifest's ``psnr_db`` measures (on the manifest's own edits the lowest
is the manifest's figure for every level), picks the floor as a client does, and refuses configurations it cannot
run."""

from __future__ import annotations

import json

import pytest

from sakura_core import cli
from sakura_core.precompute.cross_step import floor_level
from sakura_core.precompute.output_psnr import PSNR_EDITS, manifest_psnr_edits
from sakura_tools.bench.heldout import HeldOutConfig, run_heldout


def test_floor_is_the_cheapest_level_reaching_it_fp16_last():
    levels = [
        {"name": "sakura-l0", "bytes": 10, "psnr_db": 33.0},
        {"name": "sakura-l1", "bytes": 20, "psnr_db": 35.5},
        {"name": "sakura-l0+cl", "bytes": 15, "psnr_db": 36.0},
        {"name": "fp16", "bytes": 5, "psnr_db": 90.0},  # never the floor while a lossy level reaches it
    ]
    assert floor_level(levels, 35.0)["name"] == "sakura-l0+cl"
    assert floor_level(levels, 36.5)["name"] == "fp16"
    assert floor_level(levels, 95.0) is None


@pytest.mark.slow
def test_on_the_manifests_own_edit_the_bench_gives_the_manifests_psnr(demo_model):
    cfg = HeldOutConfig(templates=("astronaut",), users=("coffee",), prompts=("a cat",), steps=2)
    own_edits = manifest_psnr_edits(demo_model, 0)
    assert len(own_edits) == PSNR_EDITS >= 2 and len({p for _, p, _ in own_edits}) == PSNR_EDITS
    res = run_heldout(demo_model, cfg, say=lambda line: None, extra_edits=own_edits)
    assert len(res["rows"]) > 10 and {r["family"] for r in res["rows"]} >= {"levels", "closed-loop twins", "fp16"}
    spread = 0.0
    for r in res["rows"]:
        held_out, *own = r["heldout_psnr_db"]  # coffee / 'a cat', then the manifest's own edits
        assert min(own) == pytest.approx(r["manifest_psnr_db"], abs=2e-3), r["name"]  # the lowest of them
        assert held_out != pytest.approx(own[0], abs=1e-6) or own[0] >= 100.0, r[
            "name"
        ]  # another edit, another figure
        spread = max(spread, max(own) - min(own))
    assert spread > 0.1  # the edits differ: the minimum is not one edit's figure repeated
    (floor,) = res["floors"]
    expect = min(
        (r for r in res["rows"] if r["manifest_psnr_db"] >= cfg.floor_db and r["name"] != "fp16"),
        key=lambda r: r["bytes"],
    )
    assert floor["floor"] == expect["name"] and floor["holds"] == (expect["heldout_min_db"] >= cfg.floor_db)


def test_cli_refuses_a_template_without_another_user(tmp_path, capsys):
    out = tmp_path / "h.json"
    args = [
        "bench",
        "heldout",
        "--json",
        str(out),
        "--templates",
        "coffee",
        "--users",
        "coffee",
        "--weights",
        "random",
    ]
    assert cli.main(args) == 2
    assert "template 'coffee' has no user image other than itself" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match="kv_mode must be"):
        HeldOutConfig(kv_mode="both")


@pytest.mark.slow
def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "h.json"
    args = [
        "bench",
        "heldout",
        "--json",
        str(out),
        "--templates",
        "rocket",
        "--users",
        "chelsea",
        "--prompts",
        "a cat|a dog",
        "--kv-mode",
        "single",
        "--steps",
        "2",
        "--weights",
        "random",
    ]
    assert cli.main(args) == 0
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert all(len(r["heldout_psnr_db"]) == 2 for r in res["rows"])  # one user x two prompts
    assert not any(r["name"].endswith("+cl") for r in res["rows"])  # single mode has no twins
    assert f"rocket: {res['floors'][0]['floor']} (" in printed and "floor holds on every held-out edit" in printed
