"""``sakura bench slow-links``: sakura near the fluid bound on slow links (issue 50 item 4). Runs ``sakura bench e2e``
(sim; sakura, the oracle and the fetch-nothing baselines) over a trace folder, or reads an e2e JSON (``--from``),
then prints per class sakura / fluid bound (median / worst), sakura / oracle, oracle / bound and sakura / best
fetch-nothing policy, and the runs furthest from the bound; writes them as JSON."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

from sakura_core.files import atomic_write_json

from .slow_links import format_slow_table, format_worst_runs, slow_link_rows, worst_runs

__all__ = ["add_arguments", "run"]

_POLICIES = "sakura,oracle,on-device,on-device-cached"


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, metavar="FILE", help="write the table (and the e2e runs) here")
    parser.add_argument("--traces", help="folder of traces (e.g. `sakura traces synth --set slow --out DIR`)")
    parser.add_argument(
        "--from",
        dest="from_json",
        metavar="E2E_JSON",
        help="read the runs of an earlier `sakura bench e2e` JSON (with its runs) instead",
    )
    parser.add_argument(
        "--profile",
        default="snapdragon-8-elite-cpu,snapdragon-8-elite-gpu",
        help="comma list of device profiles (default: %(default)s)",
    )
    parser.add_argument("--geometry", default="klein4b-512-ref1024", help="comma list (default: %(default)s)")
    parser.add_argument("--kv-mode", default="per-step", help="comma list (default: %(default)s)")
    parser.add_argument("--starts", type=int, default=3, help="start offsets per trace (default %(default)s)")
    parser.add_argument(
        "--planning",
        default="1",
        help="what a decision costs: 'measured', 'off' or ms (default %(default)s: deterministic)",
    )
    parser.add_argument("--ladders", default="docs/results/ladders", help="ladder folder (default %(default)s)")
    parser.add_argument("--worst", type=int, default=5, help="runs furthest from the bound listed per combination")
    parser.add_argument("--e2e-output", action="store_true", help="print e2e's own output too")


def _e2e(args, out_json: Path) -> dict:
    from . import cli_e2e

    argv = ["--mode", "sim", "--traces", args.traces, "--policies", _POLICIES, "--profile", args.profile,
            "--kv-mode", args.kv_mode, "--geometry", args.geometry, "--starts", str(args.starts), "--steps", "4",
            "--ladders", args.ladders, "--planning", args.planning, "--requests", "ahead", "--synth-layers", "0,3",
            "--store-profile", "serving", "--no-calibrate",
            "--no-regime-map", "--json", str(out_json)]  # fmt: skip # keep: flags beside their values
    p = argparse.ArgumentParser(prog="sakura bench e2e")
    p.add_argument("-v", "--verbose", action="store_true")
    cli_e2e.add_arguments(p)
    e2e_args = p.parse_args(argv)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf) if not args.e2e_output else contextlib.nullcontext():
        cli_e2e.run(e2e_args)
    return json.loads(out_json.read_text())


def run(args) -> int:
    if bool(args.traces) == bool(args.from_json):
        print("sakura bench slow-links: give one of --traces DIR (run e2e) or --from E2E_JSON (read its runs)")
        return 2
    out = Path(args.json)
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        data = _e2e(args, out.with_suffix(".e2e.json"))
    results = data.get("results", [data])
    if any("runs" not in r for r in results):
        print(
            f"sakura bench slow-links: {args.from_json or out} has no per-run rows (an e2e run with --no-runs); "
            "rerun e2e without --no-runs"
        )
        return 2
    rows = slow_link_rows(results)
    worst = worst_runs(results, args.worst)
    print(f"command: {data.get('command', '-')}")
    print(format_slow_table(rows))
    print("\nruns furthest from the fluid bound:")
    print(format_worst_runs(worst))
    atomic_write_json(out, {"command": data.get("command"), "rows": rows, "worst_runs": worst})
    print(f"wrote {out}")
    return 0
