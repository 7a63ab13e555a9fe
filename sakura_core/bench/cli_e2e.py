"""``sakura bench e2e``: every policy, every trace; sim (phone scale, discrete-event) or live (real server, link,
decode and compute on this CPU). Prints a table and writes JSON (and PNG plots with ``--plots``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..fetch.policies import POLICIES
from ..fetch.traces import Trace, scan_traces
from ..io_utils import atomic_write_json
from ..runtime.profiles import PHONE_DIT, PROFILES, DeviceProfile, get_profile
from ..runtime.simulate import fixed_split_policy, simulate

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    from importlib import resources

    default_traces = str(resources.files("sakura_core.fetch").joinpath("traces"))
    parser.add_argument("--traces", default=default_traces, help="folder of traces (any of the 3 formats)")
    parser.add_argument(
        "--trace-classes", help="JSON {glob: class} (default: trace_classes.json in --traces, else folder names)"
    )
    parser.add_argument("--policies", default="all", help=f"comma list or 'all' ({','.join(POLICIES)})")
    parser.add_argument("--mode", choices=["sim", "live"], default="sim")
    parser.add_argument("--profile", default="snapdragon-8-elite-cpu", help=f"one of {', '.join(PROFILES)}")
    parser.add_argument("--json", required=True, help="write results here")
    parser.add_argument("--plots", help="folder for PNG plots")
    parser.add_argument("--starts", type=int, default=3, help="start offsets per trace (sim; default %(default)s)")
    parser.add_argument("--steps", type=int, default=4, help="edit steps for the codec measurements (sim)")
    parser.add_argument("--max-traces", type=int, default=3, help="live: traces to run (default %(default)s)")
    parser.add_argument("--shaping", choices=["inproc", "kernel"], default="inproc", help="live: link shaper")


def _policies(arg: str, mode: str) -> list[str]:
    names = list(POLICIES) if arg == "all" else [p.strip() for p in arg.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad:
        raise SystemExit(f"sakura bench e2e: unknown policies {bad}; choose from {', '.join(POLICIES)} or 'all'")
    if mode == "live":
        names = [p for p in names if p not in ("free-kv",)]  # a bound, not something that can run
    if "sakura" not in names:
        names.append("sakura")
    return names


def _table(summary: dict, ratios: dict) -> str:
    head = f"{'policy':<18}{'median s':>10}{'p90 s':>10}{'PSNR dB':>9}{'x sakura (med)':>16}{'min':>9}{'max':>9}"
    lines = [head, "-" * len(head)]
    for name, s in summary.items():
        r = ratios.get(name, {})
        lines.append(
            f"{name:<18}{s['median_latency_s']:>10.2f}{s['p90_latency_s']:>10.2f}{s['median_psnr_db']:>9.1f}"
            f"{r.get('median_ratio_vs_sakura', float('nan')):>16.2f}{r.get('min_ratio_vs_sakura', float('nan')):>9.2f}"
            f"{r.get('max_ratio_vs_sakura', float('nan')):>9.2f}"
        )
    return "\n".join(lines)


def _regime(ladders, floors) -> dict:
    from .plots import regime_map

    def three(step_s, mbit):
        prof = DeviceProfile("regime", "synthetic", step_s, 0.0, 0)
        trace = Trace.constant(mbit)
        compute = simulate(POLICIES["on-device-cached"](), trace, prof, ladders, floors).latency_s
        fetch = simulate(fixed_split_policy(0), trace, prof, ladders, floors).latency_s
        hybrid = min(
            simulate(fixed_split_policy(k), trace, prof, ladders, floors).latency_s for k in range(1, PHONE_DIT.layers)
        )
        return compute, fetch, hybrid

    return regime_map(three, [0.03, 0.1, 0.3, 1, 3, 10, 30, 100], [0.3, 1, 3, 10, 30, 100])


def run(args) -> int:
    if args.mode == "live":
        from .cli_live import run_live

        return run_live(args)
    from ..models.demo import load_demo_model, load_image
    from .e2e import build_phone_ladders, measure_codec_levels, run_sim, summarize, summarize_by_class

    profile = get_profile(args.profile)
    scan = scan_traces(args.traces, args.trace_classes)
    traces = scan.traces
    for path, why in scan.skipped:
        print(f"skipped {path}: {why}")
    policies = _policies(args.policies, "sim")
    t0 = time.perf_counter()
    model = load_demo_model()
    size = model.spec.image_size
    print(f"SIMULATION at phone scale: {PHONE_DIT.layers}-layer DiT, KV {PHONE_DIT.kv_bytes_fp16 / 2**20:.0f} MiB fp16, "
          f"{PHONE_DIT.steps} steps, profile {profile.name}; codec costs measured now on the demo model "
          f"({model.weights_source})")  # fmt: skip
    rows = measure_codec_levels(
        model, load_image("astronaut", size), load_image("chelsea", size), "place it", args.steps, progress=print
    )
    ladders, floors = build_phone_ladders(rows)
    print(f"quality floor (cheapest sakura level with PSNR >= 35 dB): {ladders['sakura'][0][floors['sakura']].name}")
    runs = run_sim(traces, policies, profile, ladders, floors, args.starts, progress=print)
    summary, ratios = summarize(runs)
    by_class = summarize_by_class(runs)
    for cls, part in by_class.items():
        print(f"\n[{cls}] {part['traces']} traces")
        print(_table(part["summary"], part["ratios_vs_sakura"]))
    out = {
        "mode": "sim",
        "label": "SIMULATION (discrete-event, phone-scale model, codec costs measured in this run)",
        "model": {"name": "phone-class DiT", **PHONE_DIT.__dict__, "kv_bytes_fp16": PHONE_DIT.kv_bytes_fp16},
        "profile": profile.name,
        "codec_levels": rows,
        "floors": floors,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs],
        "summary": summary,
        "ratios_vs_sakura": ratios,
        "by_class": by_class,
        "skipped_traces": [{"path": p, "reason": why} for p, why in scan.skipped],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if args.plots:
        from .plots import plot_regime_map, plot_timeline, plot_trace_levels

        plots = Path(args.plots)
        plots.mkdir(parents=True, exist_ok=True)
        sak = [r for r in runs if r["policy"] == "sakura"]
        pick = sorted(sak, key=lambda r: r["latency_s"])[len(sak) // 2]["_result"]
        plot_timeline(pick.events, plots / "timeline.png", f"sakura on {pick.trace} (sim, {profile.name})")
        trace = next(t for t in traces if t.name == pick.trace)
        names = [lv.name for lv in ladders["sakura"][0]]
        plot_trace_levels(trace, pick.decisions, names, plots / "trace_levels.png", pick.start_s, pick.latency_s)
        regime = _regime(ladders, floors)
        plot_regime_map(regime, plots / "regime_map.png")
        out["regime_map"] = regime
        print(f"plots: {plots}/timeline.png, trace_levels.png, regime_map.png")
    atomic_write_json(args.json, json.loads(json.dumps(out, default=float)))
    print(f"wrote {args.json}")
    return 0
