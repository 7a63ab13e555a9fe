"""The simulator's store-profile view (``sakura bench e2e --store-profile``): the rungs a serving store holds are
chosen by the store's own rule, a slot it does not hold is served by the nearest held rung, and the bench states the
profile in its header and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from sakura_core.cli import main
from sakura_core.policy.ladder import CrossStepLinks, Level
from sakura_core.precompute.store_profile import StoreProfile
from sakura_tools.bench.per_step_ladders import load
from sakura_tools.bench.serving_ladders import held_per_step, held_single, serving_view

ROOT = Path(__file__).resolve().parents[3]


def _lv(name: str, nbytes: int, closed: Level | None = None) -> Level:
    return Level(name, nbytes, nbytes, 0.01, 10.0 / nbytes, progressive=False, links=CrossStepLinks(closed=closed))


def test_the_per_step_view_holds_what_a_serving_store_keeps():
    """On the shipped cross-step measurement: the twins' track reaches 35 dB at l1 (35.9 dB) and 45 dB at l5
    (47.5 dB, fewer bytes than the open-loop l7 at 46.2 dB); the open loop reaches 35 dB at l5 (35.8 dB)."""
    held = held_per_step(load(), StoreProfile("serving"))
    assert held.first == {f"sakura-l{j}" for j in range(6)}  # step 0: the chain up to the top rung
    assert held.later == {"sakura-l5"} and held.twins == {"sakura-l1", "sakura-l5"}
    assert "fp16" not in held.first | held.later
    assert held_per_step(load(), StoreProfile("full")).first is None  # full: everything
    assert "steps >= 1 hold open-loop sakura-l5 and the twins of sakura-l1, sakura-l5" in held.describe()


def test_the_single_view_drops_fp16_and_the_rungs_above_the_top():
    psnr = [24.0, 30.0, 36.0, 41.0, 46.0, 52.0, 80.0]
    names = [f"sakura-l{j}" for j in range(6)] + ["fp16"]
    held = held_single(names, psnr, True, StoreProfile("serving"))
    assert held.first == {f"sakura-l{j}" for j in range(5)}  # progressive: the chain below the floor stays
    assert held_single(names, psnr, False, StoreProfile("serving")).first == {"sakura-l2", "sakura-l3", "sakura-l4"}
    no_top = held_single(names, [24.0, 30.0, 36.0, 41.0, 43.0, 44.0, 80.0], True, StoreProfile("serving"))
    assert "fp16" in no_top.first  # nothing reaches 45 dB: the fp16 stays as the top rung


def test_a_missing_rung_is_served_by_the_nearest_held_one_and_twins_only_where_held():
    twin = _lv("sakura-l1+cl", 50)
    ladder = [
        _lv("sakura-l0", 80),
        _lv("sakura-l1", 100, twin),
        _lv("sakura-l2", 200),
        _lv("sakura-l3", 400),
        _lv("fp16", 1000),
    ]
    held = held_single([lv.name for lv in ladder], [30, 36, 46, 50, 80], False, StoreProfile("serving"))
    assert held.first == {"sakura-l1", "sakura-l2"}
    (view,) = serving_view([ladder], held, layers=1, kv_mode="single")
    assert [lv.name for lv in view] == [lv.name for lv in ladder]  # every slot keeps its index and name
    assert [lv.nbytes for lv in view] == [100, 100, 200, 200, 200]  # l0 -> l1 (up), l3 and fp16 -> l2 (down)
    assert view[1].closed == twin and view[0].closed is None
    per_step_held = held.__class__(
        "serving", first=frozenset({"sakura-l1"}), later=frozenset({"sakura-l2"}), twins=frozenset({"sakura-l1"})
    )
    step0, step1 = serving_view([ladder, ladder], per_step_held, layers=1, kv_mode="per-step")
    assert step0[1].closed is None  # step 0 roots the track: no twin
    # l1's open loop is not held: l2 stands in, the twin stays
    assert step1[1].closed == twin and step1[1].nbytes == 200
    assert serving_view(
        [ladder], held_single([lv.name for lv in ladder], [30] * 5, False, StoreProfile("full")), 1, "single"
    ) == [ladder]


def test_the_e2e_bench_states_the_store_profile(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    common = ["bench", "e2e", "--mode", "sim", "--traces", "sakura_core/fetch/traces", "--policies",
              "sakura,fetch-fp16", "--kv-mode", "per-step", "--geometry", "klein4b-512-ref1024", "--starts", "1",
              "--ladders", "docs/results/ladders", "--planning", "off", "--no-calibrate", "--no-runs",
              "--no-regime-map"]  # fmt: skip # keep: flags beside their values
    out = {}
    for profile in ("serving", "full"):
        path = tmp_path / f"{profile}.json"
        assert main([*common, "--store-profile", profile, "--json", str(path)]) == 0
        out[profile] = (json.loads(path.read_text()), capsys.readouterr().out)
    data, printed = out["serving"]
    assert data["store_profile"] == "serving" and "--store-profile serving" in data["command"]
    assert data["store_rungs"]["later_twins"] == ["sakura-l1", "sakura-l5"]
    assert data["store_rungs"]["fetch-fp16"] == "full"  # the baseline needs a full store's fp16: said, not hidden
    assert "store profile serving: step 0 holds" in printed
    assert "fetch-fp16: the exact fp16 of a store of profile full" in printed
    assert any(line.startswith("store profile serving") for line in data["header"])
    full, printed_full = out["full"]
    assert full["store_profile"] == "full" and "store profile full: every rung" in printed_full


def test_the_results_doc_states_each_runs_store_profile():
    from sakura_tools.bench.results_doc import render_section
    from sakura_tools.bench.store_profile_table import profile_note

    assert profile_note({}).startswith("Store profile: full (the run predates `--store-profile`")
    committed = json.loads((ROOT / "docs/results/store_profile/paper_1ms_serving.json").read_text())
    assert profile_note(committed).startswith("Store profile: serving: step 0 holds")
    out = render_section("store-profile", ROOT)
    assert "| 1 ms | serving |" in out and "| measured | full |" in out and ": met (" in out
