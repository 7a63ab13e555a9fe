"""Per-step ladders at 8, 28 and 50 steps (issue 50, item 2): the measured files, the ladder model fitted on them
with its error stated on a step count it never saw (checked here against the measurement), the geometry ladders
stretched to a step count, and a 28-step per-step edit simulated by ``sakura bench e2e --edit-steps``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sakura_core.cli import main
from sakura_core.fetch.synth import random_walk, write_pensieve
from sakura_core.runtime.sim_ladders import ShardLadders
from sakura_tools.bench.e2e_stream import load_e2e
from sakura_tools.bench.per_step_ladders import per_step_ladders, track_psnr_db
from sakura_tools.bench.step_ladders import (
    MODEL_PATH,
    fit_model,
    heldout_check,
    measured_data,
    model_data,
    per_step_data,
    stretch_ladders,
)

ROOT = Path(__file__).resolve().parents[3]


def test_the_measured_counts_include_8_steps_beside_4():
    measured = measured_data()
    assert {2, 4, 8} <= set(measured)
    for steps, data in measured.items():
        assert data["steps"] == steps and all(len(lv["ratio_vs_fp16"]) == steps for lv in data["levels"])


def test_the_committed_model_states_its_error_on_a_count_left_out_of_its_fit():
    """The stated held-out error is what the same fit without that count makes of its measurement."""
    model = json.loads(MODEL_PATH.read_text())
    h = model["heldout"]
    measured = measured_data()
    assert h["steps"] not in h["fit_on"] and sorted(measured) == model["fit_on"]
    assert heldout_check(measured, h["steps"]) == h  # the statement is reproduced from the measurements
    pred = model_data(fit_model({c: d for c, d in measured.items() if c != h["steps"]}), h["steps"])
    meas = measured[h["steps"]]
    for p, m in zip(pred["levels"], meas["levels"], strict=True):
        assert abs(p["psnr_db"] - m["psnr_db"]) <= h["max_psnr_error_db"] + 1e-9
        assert abs(sum(1 / r for r in p["ratio_vs_fp16"]) / sum(1 / r for r in m["ratio_vs_fp16"]) - 1) <= (
            h["max_bytes_rel_error"] + 1e-4
        )
    assert h["max_psnr_error_db"] < 3.0 and h["max_bytes_rel_error"] < 0.5  # a usable model, not just a stated one


def test_the_model_reproduces_a_count_it_was_fitted_on_closely_and_refuses_one_count():
    measured = measured_data()
    model = fit_model(measured)
    for steps in measured:
        for p, m in zip(model_data(model, steps)["levels"], measured[steps]["levels"], strict=True):
            assert p["ratio_vs_fp16"][0] == pytest.approx(m["ratio_vs_fp16"][0], rel=1e-3)  # step 0: coded alone
    with pytest.raises(ValueError, match="two step counts > 1"):
        fit_model({4: measured[4]})


@pytest.mark.parametrize("steps", [28, 50])
def test_28_and_50_step_ladders_come_from_the_model_and_make_simulator_ladders(steps):
    data = per_step_data(steps)
    assert data["steps"] == steps and "model" in data["source"]
    speed = {lv["name"]: 1e9 for lv in data["levels"]}
    ladders = per_step_ladders(data, 1_000_000, 25, speed, 35.0)
    assert len(ladders) == steps * 25
    names = [lv.name for lv in ladders[-1]]
    reuse = data["reuse"]["psnr_db"] >= 35.0  # the zero-byte rung joins later steps' ladders only above the floor
    assert names[0] == ("reuse" if reuse else "sakura-l0") and names[-1] == "fp16"
    step0 = [lv.nbytes for lv in ladders[0]]
    assert step0 == sorted(step0)  # cheapest first
    assert any(track_psnr_db(lv) >= 35.0 for lv in data["levels"])  # a floor exists
    assert per_step_data(4) == measured_data()[4]  # a measured count is never modelled


def test_stretched_geometry_ladders_keep_each_levels_edit_psnr():
    lad = ShardLadders.from_dict(json.loads((ROOT / "docs/results/ladders/phone-dit-512.per-step.json").read_text()))
    assert stretch_ladders(lad, lad.steps) is lad
    long = stretch_ladders(lad, 28)
    assert long.steps == 28 and "stretched" in long.source
    for name, fam in long.families.items():
        assert fam.shards == 28 * lad.layers
        assert fam.psnr_db() == pytest.approx(lad.families[name].psnr_db(), abs=1e-9)
        assert fam.bytes[27 * lad.layers] == lad.families[name].bytes[3 * lad.layers]  # the last step maps to the last


def test_a_28_step_per_step_edit_runs_in_the_e2e_bench(tmp_path):
    (tmp_path / "t").mkdir()
    write_pensieve(random_walk(3, 30.0, 0.3, seconds=200), tmp_path / "t" / "walk.log")
    out = tmp_path / "e.jsonl"
    argv = ["bench", "e2e", "--traces", str(tmp_path / "t"), "--policies", "sakura,on-device", "--profile",
            "snapdragon-8-elite-gpu", "--kv-mode", "per-step", "--geometry", "phone-dit-512", "--edit-steps", "28",
            "--starts", "1", "--ladders", str(ROOT / "docs/results/ladders"), "--planning", "1", "--no-calibrate",
            "--no-regime-map", "--json", str(out)]  # fmt: skip # keep: flags beside their values
    assert main(argv) == 0
    r = load_e2e(out)["results"][0]
    assert r["steps"] == 28 and r["model"]["steps"] == 28 and "--edit-steps 28" in load_e2e(out)["command"]
    sak = next(x for x in r["runs"] if x["policy"] == "sakura")
    assert len(sak["splits"]) == 28  # one split per step
    assert any("at 28 steps" in line for line in r["header"])
    on_device = next(x for x in r["runs"] if x["policy"] == "on-device")
    assert sak["latency_s"] < on_device["latency_s"]


def test_bench_scale_times_an_edit_on_the_committed_ladders(tmp_path, capsys):
    from sakura_tools.bench.scale import scale_case

    row = scale_case(8, ["sakura", "oracle", "on-device"], seed=1, ladders_dir=ROOT / "docs/results/ladders")
    assert row["shards"] == 8 * 25
    lat = row["latency_s"]
    assert lat["fluid-bound"] <= lat["oracle"] + 1e-9 and lat["fluid-bound"] <= lat["sakura"] + 1e-9
    out = tmp_path / "s.json"
    assert (
        main(
            [
                "bench",
                "scale",
                "--steps",
                "8",
                "--policies",
                "sakura,oracle",
                "--ladders",
                str(tmp_path),
                "--json",
                str(out),
            ]
        )
        == 2
    )
    assert "no " in capsys.readouterr().out and not out.exists()


def test_bad_edit_steps_and_a_streamed_live_run_are_refused(tmp_path):
    base = ["bench", "e2e", "--traces", str(ROOT / "sakura_core/fetch/traces"), "--no-calibrate"]
    with pytest.raises(SystemExit, match="--edit-steps needs step counts >= 2"):
        main([*base, "--edit-steps", "1", "--json", str(tmp_path / "a.jsonl")])
    with pytest.raises(SystemExit, match="comma list of step counts"):
        main([*base, "--edit-steps", "many", "--json", str(tmp_path / "a.jsonl")])
    with pytest.raises(SystemExit, match="a live run writes one JSON"):
        main([*base, "--mode", "live", "--json", str(tmp_path / "a.jsonl")])
    assert not (tmp_path / "a.jsonl").exists()
