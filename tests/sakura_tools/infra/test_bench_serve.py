"""``sakura bench serve`` at a tiny size: both servers answer every request of every run without an error, the
JSON holds what the table printed, and a ratio the run cannot measure is reported as unmeasured, not as a number."""

from __future__ import annotations

import json

from ci_deps import require_or_skip

from sakura_core.cli import main
from sakura_tools.infra.nginx import find_nginx


def test_bench_serve_runs_both_servers_and_writes_its_json(tmp_path, capsys):
    require_or_skip(find_nginx() is not None, "nginx is not installed (apt-get install nginx-light; .ci/run does)")
    out = tmp_path / "serve.json"
    argv = [
        "bench",
        "serve",
        "--json",
        str(out),
        "--connections",
        "2,4",
        "--requests",
        "40",
        "--sizes-kib",
        "16,32",
        "--layers",
        "2",
        "--soak",
        "1",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert sorted((r["server"], r["connections"]) for r in runs) == [
        ("nginx", 2),
        ("nginx", 4),
        ("sakura", 2),
        ("sakura", 4),
    ]
    for r in [*runs, *report["soak_runs"]]:
        assert (r["completed"], r["errors"]) == (40, 0), r
        assert r["req_per_s"] > 0 and r["p50_ms"] <= r["p99_ms"]
    assert report["config"]["shards"] == 4  # 2 layers x 2 sizes
    assert report["targets"]["zero_errors_at_4"] is True
    for level, ratio in report["ratios"].items():
        assert f"{level:>5} conns: nginx/sakura req/s {ratio['nginx_over_sakura_req_per_s']:.2f}x" in printed
        cpu = ratio["sakura_over_nginx_cpu_per_req"]
        assert cpu is None or 0 < cpu < 1e4, cpu  # never a division by a clock tick's zero
    assert f"wrote {out}" in printed
