"""``sakura bench e2e``: every policy, every trace; sim (phone scale, discrete-event) or live (real server, link,
decode and compute on this CPU). Prints a table and writes JSON (and PNG plots with ``--plots``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..fetch.traces import scan_traces
from ..files import atomic_write_json
from ..policy.policies import POLICIES
from ..runtime.profiles import GEOMETRIES, PROFILES, get_profile, sources_table
from ..runtime.simulate import KV_MODES, kv_mode_view
from .e2e_report import format_table, select_policies

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    from importlib import resources

    default_traces = str(resources.files("sakura_core.fetch").joinpath("traces"))
    parser.add_argument("--traces", default=default_traces, help="folder of traces (any of the 3 formats)")
    parser.add_argument(
        "--per-step-ladders",
        choices=("measured", "single"),
        default="measured",
        help="per-step sim: sakura's ladders measured on per-step KV (bench/per_step_ladders.json) or the single-mode "
        "ratios replicated per step (the old model; default: %(default)s)",
    )
    parser.add_argument(
        "--trace-classes", help="JSON {glob: class} (default: trace_classes.json in --traces, else folder names)"
    )
    parser.add_argument("--policies", default="all", help=f"comma list or 'all' ({','.join(POLICIES)})")
    parser.add_argument("--mode", choices=["sim", "live"], default="sim")
    parser.add_argument(
        "--profile", default="snapdragon-8-elite-cpu", help=f"one of (sim: a comma list of) {', '.join(PROFILES)}"
    )
    parser.add_argument("--geometry", default="phone-dit-512", help=f"sim: comma list of {', '.join(GEOMETRIES)}")
    parser.add_argument(
        "--kv-mode", default="single", help=f"sim: comma list of {', '.join(KV_MODES)} (DESIGN.md); live: one of them"
    )
    parser.add_argument("--no-calibrate", action="store_true", help="sim: skip the CPU calibration of the cost model")
    parser.add_argument("--json", required=True, help="write results here")
    parser.add_argument("--plots", help="folder for PNG plots")
    parser.add_argument("--starts", type=int, default=3, help="start offsets per trace (sim; default %(default)s)")
    parser.add_argument("--steps", type=int, default=4, help="edit steps (sim: for the codec measurements)")
    parser.add_argument("--max-traces", type=int, default=3, help="live: traces to run (default %(default)s)")
    parser.add_argument("--shaping", choices=["inproc", "kernel"], default="inproc", help="live: link shaper")


REGIME_TFLOPS = [0.05, 0.2, 1.0, 3.5, 14.0, 50.0]  # device effective TFLOP/s (phone CPU .. NPU and beyond)
REGIME_MBITS = [1, 3, 10, 30, 100, 300, 1000]  # link Mbit/s


def _print_by_class(by_class: dict) -> None:
    for cls, part in by_class.items():
        print(f"\n[{cls}] {part['traces']} traces")
        print(format_table(part["summary"], part["ratios_vs_sakura"]))


def _plots(plots_dir, runs, traces, ladders, profile, regime) -> None:
    from .plots import plot_regime_map, plot_timeline, plot_trace_levels

    plots = Path(plots_dir)
    plots.mkdir(parents=True, exist_ok=True)
    sak = [r for r in runs if r["policy"] == "sakura"]
    pick = sorted(sak, key=lambda r: r["latency_s"])[len(sak) // 2]["_result"]
    plot_timeline(pick.events, plots / "timeline.png", f"sakura on {pick.trace} (sim, {profile.name})", pick.decisions)
    trace = next(t for t in traces if t.name == pick.trace)
    names = [lv.name for lv in ladders["sakura"][0]]
    plot_trace_levels(trace, pick.decisions, names, plots / "trace_levels.png", pick.start_s, pick.latency_s)
    plot_regime_map(regime, plots / "regime_map.png")
    print(f"plots: {plots}/timeline.png, trace_levels.png, regime_map.png")


def _calibration(model, args) -> dict | None:
    if args.no_calibrate:
        return None
    from .calibrate import calibrate_cpu, format_calibration

    cal = calibrate_cpu(model)
    print(format_calibration(cal))
    return cal


def _combos(args) -> list[tuple[str, str, str]]:
    """(kv_mode, geometry, profile) for every combination of the comma lists, each name checked."""
    modes, geos, profs = ([x.strip() for x in a.split(",") if x.strip()] for a in (args.kv_mode, args.geometry,
                                                                                  args.profile))  # fmt: skip
    bad = [m for m in modes if m not in KV_MODES]
    if bad:
        raise SystemExit(f"sakura bench e2e: unknown --kv-mode {bad}; choose from {', '.join(KV_MODES)}")
    for p in profs:
        for g in geos:
            get_profile(p, g)  # raises naming the choices
    return [(m, g, p) for m in modes for g in geos for p in profs]


def _simulate_combo(args, combo, traces, policies, rows, plots_dir) -> dict:
    """One (kv_mode, geometry, profile): the simulation over every trace, tables and regime map printed."""
    from .e2e import build_phone_ladders, measured_per_step_sakura, run_sim, summarize, summarize_by_class
    from .phone_scale import format_regime, regime_map

    kv_mode, geometry, name = combo
    profile = get_profile(name, geometry)
    g = profile.model
    print(
        f"\n===== {kv_mode} KV, {g.name}, {profile.name} ({profile.effective_flop_per_s / 1e12:.2f} TFLOP/s: cached "
        f"step {profile.step_cached_s:.3f} s, template pass {profile.template_pass_s:.3f} s; KV "
        f"{g.kv_bytes_fp16 / 2**20:.0f} MiB fp16 per template{' per step' if kv_mode == 'per-step' else ''}) ====="
    )
    ladders, floors = build_phone_ladders(rows, kv_mode_view(profile, kv_mode).model)
    if kv_mode == "per-step" and getattr(args, "per_step_ladders", "measured") == "measured":
        ladders["sakura"], floors["sakura"] = measured_per_step_sakura(rows, g)
        print("sakura per-step ladders: measured on cross-step coded per-step KV (bench/per_step_ladders.json)")
    for fam in ("sakura", "cachegen"):
        print(f"quality floor {fam} (cheapest level with PSNR >= 35 dB): {ladders[fam][0][floors[fam]].name}")
    runs = run_sim(traces, policies, profile, ladders, floors, args.starts, kv_mode=kv_mode)
    summary, ratios = summarize(runs)
    by_class = summarize_by_class(runs)
    _print_by_class(by_class)
    regime = regime_map(profile, ladders, floors, REGIME_TFLOPS, REGIME_MBITS, kv_mode=kv_mode)
    print()
    print(format_regime(regime))
    out = {
        "profile": profile.name,
        "profile_details": {
            "soc": profile.soc,
            "effective_flop_per_s": profile.effective_flop_per_s,
            "layer_overhead_s": profile.layer_overhead_s,
            "fixed_s": profile.fixed_s,
            "layer_cached_s": profile.layer_cached_s,
            "layer_full_s": profile.layer_full_s,
            "template_pass_s": profile.template_pass_s,
        },  # fmt: skip
        "kv_mode": kv_mode,
        "geometry": g.name,
        "model": g.as_dict(),
        "floors": floors,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs],
        "summary": summary,
        "ratios_vs_sakura": ratios,
        "by_class": by_class,
        "regime_map": regime,
    }
    if plots_dir:
        sub = Path(plots_dir) / f"{kv_mode}.{g.name}.{profile.name}" if len(_combos(args)) > 1 else plots_dir
        _plots(sub, runs, traces, ladders, profile, regime)
    return out


def run(args) -> int:
    """``--profile``, ``--geometry`` and ``--kv-mode`` take comma lists: the codecs are measured (and the CPU
    calibrated) once, every combination is simulated; with one combination the JSON is that run's, with several
    it holds them under ``results``."""
    if args.mode == "live":
        from .cli_live import run_live

        return run_live(args)
    from ..models.edit_model import load_demo_model, load_image
    from .e2e import measure_codec_levels

    combos = _combos(args)
    scan = scan_traces(args.traces, args.trace_classes)
    for path, why in scan.skipped:
        print(f"skipped {path}: {why}")
    policies = select_policies(args.policies, "sim")
    t0 = time.perf_counter()
    model = load_demo_model()
    size = model.spec.image_size
    print(sources_table())
    print(f"SIMULATION at phone scale; codec costs measured now on the demo model ({model.weights_source})")
    calibration = _calibration(model, args)
    rows = measure_codec_levels(
        model, load_image("astronaut", size), load_image("chelsea", size), "place it", args.steps, progress=print
    )
    results = [_simulate_combo(args, c, scan.traces, policies, rows, args.plots) for c in combos]
    common = {
        "mode": "sim",
        "label": "SIMULATION (discrete-event, phone-scale model, codec costs measured in this run)",
        "calibration": calibration,
        "codec_levels": rows,
        "skipped_traces": [{"path": p, "reason": why} for p, why in scan.skipped],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out = {**common, **results[0]} if len(results) == 1 else {**common, "results": results}
    atomic_write_json(args.json, json.loads(json.dumps(out, default=float)))
    print(f"wrote {args.json}")
    return 0
