"""The slow-link table: per class sakura / fluid bound, / oracle, / best fetch-nothing policy, with hand-made runs
whose ratios are known; the targets marked; the command refuses an e2e JSON without runs."""

import json

import pytest

from sakura_core.cli import main
from sakura_tools.bench.slow_links import format_slow_table, slow_link_rows, worst_runs


def _runs():
    rows = []
    # two 3G runs: sakura 110 / 100 (bound 100, oracle 105, on-device 200); 102 / 100 (oracle 100, on-device 101)
    for trace, lat in (
        ("a", {"fluid-bound": 100, "sakura": 110, "oracle": 105, "on-device": 200}),
        ("b", {"fluid-bound": 100, "sakura": 102, "oracle": 100, "on-device": 101}),
    ):
        for policy, s in lat.items():
            rows.append(
                {
                    "trace": trace,
                    "trace_class": "3G",
                    "start_s": 0.0,
                    "policy": policy,
                    "latency_s": s,
                    "splits": [25, 0],
                    "bytes_fetched": 10**6,
                }
            )
    return [{"kv_mode": "per-step", "geometry": "g", "profile": "snapdragon-8-elite-cpu", "runs": rows}]


def test_rows_hold_the_ratios_and_which_targets_hold():
    (row,) = slow_link_rows(_runs())
    assert row["class"] == "3G" and row["runs"] == 2
    assert row["sakura_vs_bound"] == pytest.approx({"median": 1.06, "worst": 1.10})
    assert row["sakura_vs_oracle"] == pytest.approx({"median": (110 / 105 + 1.02) / 2, "worst": 110 / 105})
    assert row["sakura_vs_nothing"]["worst"] == pytest.approx(102 / 101)
    assert row["targets_met"] == {"bound_median": False, "oracle_worst": True, "nothing_worst": True}
    table = format_slow_table([row])
    assert "| 1.060 / 1.100 * |" in table and "cpu | 3G | 2 |" in table
    (w, _) = worst_runs(_runs(), 5)
    assert w["trace"] == "a" and w["sakura_s"] == 110 and w["oracle_s"] == 105 and w["nothing_s"] == 200


def test_cli_reads_an_e2e_json_and_refuses_one_without_runs(tmp_path, capsys):
    src = tmp_path / "e2e.json"
    src.write_text(json.dumps({"command": "sakura bench e2e ...", "results": _runs()}))
    assert main(["bench", "slow-links", "--from", str(src), "--json", str(tmp_path / "t.json")]) == 0
    assert "1.060 / 1.100 *" in capsys.readouterr().out
    assert json.loads((tmp_path / "t.json").read_text())["rows"][0]["runs"] == 2
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"results": [{k: v for k, v in _runs()[0].items() if k != "runs"}]}))
    assert main(["bench", "slow-links", "--from", str(bare), "--json", str(tmp_path / "u.json")]) == 2
    assert "--no-runs" in capsys.readouterr().out
    assert main(["bench", "slow-links", "--json", str(tmp_path / "v.json")]) == 2
