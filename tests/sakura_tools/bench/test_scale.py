"""The bench at scale (issue 50, item 1): ``sakura bench scale`` times one per-step edit with every policy and the
bound; ``run_sim`` keeps a run's whole result (events, decisions) only for the policies asked, so a long e2e run's
memory does not grow with its runs."""

import json

from sakura_core.cli import main
from sakura_core.fetch.traces import Trace
from sakura_core.runtime.profiles import get_profile
from sakura_tools.bench.e2e import run_sim
from sakura_tools.bench.scale import format_scale_table, scale_case, scale_ladders


def test_a_scale_case_times_every_policy_and_the_bound():
    row = scale_case(2, ["sakura", "oracle", "on-device"], seed=1)
    assert row["shards"] == 2 * 25 and set(row["cpu_s"]) == {"fluid-bound", "sakura", "oracle", "on-device"}
    assert all(v >= 0 for v in row["cpu_s"].values()) and row["peak_rss_bytes"] > 0
    lat = row["latency_s"]
    assert lat["fluid-bound"] <= lat["oracle"] + 1e-9 and lat["fluid-bound"] <= lat["sakura"] + 1e-9
    table = format_scale_table([row], before=[{**row, "cpu_s_total": 99.0}])
    assert "2 x 25" in table and "(99.00)" in table and "--before" in table


def test_the_scale_command_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "scale.json"
    assert main(["bench", "scale", "--steps", "1", "--policies", "sakura,oracle", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["rows"][0]["steps"] == 1 and "sakura bench scale --steps 1" in data["command"]
    assert "all policies s" in capsys.readouterr().out
    assert main(["bench", "scale", "--policies", "sakura", "--json", str(out)]) == 2  # the oracle is the point
    assert "must name sakura and oracle" in capsys.readouterr().out


def test_run_sim_keeps_a_runs_events_only_where_asked():
    prof = get_profile("snapdragon-8-elite-cpu", "phone-dit-512")
    ladders, floors = scale_ladders(prof.model.shard_bytes_fp16, prof.model.layers)
    trace = Trace.constant(30.0)
    runs = run_sim([trace], ["sakura", "on-device"], prof, ladders, floors, 1)
    assert not any("_result" in r for r in runs)  # old: every run held its SimResult (events, decisions)
    runs = run_sim([trace], ["sakura", "on-device"], prof, ladders, floors, 1, keep_results=("sakura",))
    kept = [r["policy"] for r in runs if "_result" in r]
    assert kept == ["sakura"] and next(r for r in runs if r["policy"] == "sakura")["_result"].result.events


def test_a_run_that_keeps_no_events_gives_the_same_figures():
    from sakura_core.policy.policies import make_policy
    from sakura_core.runtime.simulate import SimConfig, simulate

    prof = get_profile("snapdragon-8-elite-gpu", "phone-dit-512")  # no CPU sharing: its busy segments are not kept
    ladders, floors = scale_ladders(prof.model.shard_bytes_fp16, prof.model.layers)
    slow = Trace.constant(0.5)  # fetch-fp16 waits ~10^3 rechecks for its shards
    full = simulate(make_policy("fetch-fp16"), slow, prof, ladders, floors, config=SimConfig())
    none = simulate(make_policy("fetch-fp16"), slow, prof, ladders, floors, config=SimConfig(events=False))
    assert len(full.result.events) > 1000 and none.result.events == []
    assert (none.result.latency_s, none.result.bytes_fetched, none.result.decisions) == (
        full.result.latency_s,
        full.result.bytes_fetched,
        full.result.decisions,
    )
