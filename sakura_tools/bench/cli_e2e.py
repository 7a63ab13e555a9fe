"""``sakura bench e2e``: every policy, every trace; sim (phone scale, discrete-event) or live (real server, link,
decode and compute on this CPU). Prints a table and writes JSON (and PNG plots with ``--plots``)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from sakura_core.fetch.traces import scan_traces
from sakura_core.runtime.profiles import get_profile, sources_table

from .e2e_args import add_arguments, parse_combos, sim_config
from .e2e_header import FP16_BASELINE_NOTE, sim_header, store_view
from .e2e_report import format_table, select_policies
from .e2e_stream import open_sink
from .e2e_summary import FLUID_BOUND

__all__ = ["add_arguments", "run"]


REGIME_TFLOPS = [0.05, 0.2, 1.0, 3.5, 14.0, 50.0]  # device effective TFLOP/s (phone CPU .. NPU and beyond)
REGIME_MBITS: list[float] = [1, 3, 10, 30, 100, 300, 1000]  # link Mbit/s


def _plots(plots_dir, runs, traces, ladders, profile, regime) -> None:
    from .plots import plot_regime_map, plot_timeline, plot_trace_levels

    plots = Path(plots_dir)
    plots.mkdir(parents=True, exist_ok=True)
    sak = [r for r in runs if r["policy"] == "sakura"]
    pick = sorted(sak, key=lambda r: r["latency_s"])[len(sak) // 2]["_result"]
    plot_timeline(
        pick.result.events,
        plots / "timeline.png",
        f"sakura on {pick.trace} (sim, {profile.name})",
        pick.result.decisions,
    )
    trace = next(t for t in traces if t.name == pick.trace)
    names = [lv.name for lv in ladders["sakura"][0]]
    plot_trace_levels(
        trace, pick.result.decisions, names, plots / "trace_levels.png", pick.start_s, pick.result.latency_s
    )
    if regime is not None:
        plot_regime_map(regime, plots / "regime_map.png")
    print(f"plots: {plots}/timeline.png, trace_levels.png{', regime_map.png' if regime is not None else ''}")


def _argv(args) -> list[str]:
    """The sim command's options as given (the JSON records the command that made it)."""
    keys = (
        "mode",
        "traces",
        "policies",
        "profile",
        "kv_mode",
        "geometry",
        "starts",
        "steps",
        "ladders",
        "planning",
        "prefetch_gib",
        "requests",
        "synth_layers",
        "store_profile",
        "edit_steps",
        "events",
    )
    out = []
    for k in keys:
        v = getattr(args, k, None)
        if v is not None and v != "":
            out += [f"--{k.replace('_', '-')}", str(v)]
    flags = (
        ("--no-calibrate", args.no_calibrate),
        ("--no-runs", args.no_runs),
        ("--no-regime-map", getattr(args, "no_regime_map", False)),
    )
    return out + [f for f, on in flags if on]


def _ladder_refs(args, ladders_by: dict) -> dict:
    """The ladders the run used: their files and digests with ``--ladders``, else the ladders themselves."""
    from .e2e_ladders import ladder_file

    if not args.ladders:
        return {f"{g}.{m}": lad.as_dict() for (g, m), lad in ladders_by.items()}
    out = {}
    for g, m in ladders_by:
        path = ladder_file(args.ladders, g, m)
        out[f"{g}.{m}"] = {"file": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return out


def _calibration(model, args) -> dict | None:
    from .calibrate import calibrate_cpu, format_calibration

    cal = calibrate_cpu(model)
    print(format_calibration(cal))
    return cal


def _combo_ladders(args, kv_mode, profile, lad):
    """(ladders, floors, held store rungs, header lines) of one combination: per-step KV at an edit's step count
    gets the geometry's ladders stretched to it and sakura's per-step ladders measured or modelled for it."""
    from .e2e import sim_ladders
    from .step_ladders import per_step_data, stretch_ladders

    g = profile.model
    measured = getattr(args, "per_step_ladders", "measured")
    lad = stretch_ladders(lad, g.steps) if kv_mode == "per-step" else lad
    data = per_step_data(g.steps) if kv_mode == "per-step" and measured == "measured" else None
    ladders, floors = sim_ladders(lad, kv_mode, g, measured, data)
    lines = []
    if data is not None:
        src = "bench/per_step_ladders.json" if "model" not in data["source"] else data["source"]["model"]
        lines.append(
            f"sakura per-step ladders: cross-step coded per-step KV at {g.steps} steps ({src}: bytes and "
            "PSNR per level and step, trained demo model), decode time per level from the ladders above"
        )
    if "stretched" in lad.source:
        lines.append(f"other families' per-step ladders: {lad.source['stretched']}")
    ladders, held = store_view(args, lad, ladders, kv_mode, g, measured, data)
    return lad, ladders, floors, held, lines


def _on_run(sink, events: set[str], plotted: bool):
    """Each run's row to the sink as it is made (events and decisions only for ``events``' policies), its
    ``_result`` dropped unless a plot needs it (sakura's, with ``--plots``)."""

    def on_run(row: dict) -> None:
        res = row.get("_result")
        out = {k: v for k, v in row.items() if not k.startswith("_")}
        if res is not None and row["policy"] in events:
            out["events"], out["decisions"] = res.result.events, res.result.decisions
        sink.run(out)
        if not (plotted and row["policy"] == "sakura"):
            row.pop("_result", None)

    return on_run


def _simulate_combo(args, combo, traces, policies, ladders_by, sink) -> None:
    """One (kv_mode, geometry, profile, steps): the simulation over every trace, each run streamed to ``sink``,
    tables and regime map printed, the combination's summaries written to ``sink`` after its runs."""
    from .e2e import run_sim
    from .e2e_summary import format_headline, summarize, summarize_by_class
    from .regime import format_regime, regime_map

    kv_mode, geometry, name, steps = combo
    profile = get_profile(name, geometry)
    if steps is not None and steps != profile.model.steps:
        profile = profile.with_geometry(profile.model.with_fields(steps=steps))
    g = profile.model
    print(
        f"\n===== {kv_mode} KV, {g.name}, {g.steps} steps, {profile.name} ({profile.effective_flop_per_s / 1e12:.2f} "
        f"TFLOP/s: cached step {profile.step_cached_s:.3f} s, template pass {profile.template_pass_s:.3f} s; KV "
        f"{g.kv_bytes_fp16 / 2**20:.0f} MiB fp16 per template{' per step' if kv_mode == 'per-step' else ''}) ====="
    )
    config = sim_config(args)
    lad, ladders, floors, held, lines = _combo_ladders(args, kv_mode, profile, ladders_by[(geometry, kv_mode)])
    header = sim_header(args, kv_mode, profile, lad, config) + lines
    header += [held.describe(), FP16_BASELINE_NOTE if held.profile == "serving" else "fetch-fp16: the store's fp16"]
    print("\n".join(header))
    events = {p.strip() for p in (getattr(args, "events", None) or "").split(",") if p.strip()}
    plotted = bool(args.plots)
    keep = tuple(events | ({"sakura"} if plotted else set()))  # only these runs record events
    runs = run_sim(
        traces,
        policies,
        profile,
        ladders,
        floors,
        args.starts,
        kv_mode=kv_mode,
        config=config,
        keep_results=keep,
        on_run=_on_run(sink, events, plotted),
    )
    summary, ratios = summarize(runs)
    by_class = summarize_by_class(runs)
    for cls, part in by_class.items():
        print(f"\n[{cls}] {part['traces']} traces")
        print(format_table(part["summary"], part["ratios_vs_sakura"]))
        print(format_headline(part["headline"]))
    timed = [r for r in runs if r.get("decisions")]
    per = sum(r["planning_s"] for r in timed) / sum(r["decisions"] for r in timed) if timed else None
    if per is not None:
        print(f"\nplanning charged: {per * 1e3:.3f} ms per decision on average over {len(timed)} runs")
    regime = None
    if not args.no_regime_map:
        regime = regime_map(profile, ladders, floors, REGIME_TFLOPS, REGIME_MBITS, kv_mode=kv_mode)
        print()
        print(format_regime(regime))
    if plotted:
        sub = Path(args.plots) / f"{kv_mode}.{g.name}.{profile.name}" if len(parse_combos(args)) > 1 else args.plots
        _plots(sub, [r for r in runs if r["policy"] != FLUID_BOUND], traces, ladders, profile, regime)
    sink.result(
        {
            "profile": profile.name,
            "profile_details": {k: getattr(profile, k) for k in _PROFILE_DETAILS},
            "kv_mode": kv_mode,
            "geometry": g.name,
            "steps": g.steps,
            "model": g.as_dict(),
            "header": header,
            "settings": {
                "starts": args.starts,
                "planning": config.planning,
                "planning_s": config.planning_s,
                "ladders": args.ladders,
                "ladder_source": lad.source,
            },
            "store_profile": held.profile,
            "store_rungs": {**held.as_dict(), "fetch-fp16": "full" if held.profile == "serving" else held.profile},
            "floors": floors,
            "summary": summary,
            "ratios_vs_sakura": ratios,
            "by_class": by_class,
            "regime_map": regime,
        }
    )


_PROFILE_DETAILS = (
    "soc",
    "effective_flop_per_s",
    "layer_overhead_s",
    "fixed_s",
    "layer_cached_s",
    "layer_full_s",
    "template_pass_s",
    "cpu_slowdown",
    "dit_cpu_cores",
)


def run(args) -> int:
    """``--profile``, ``--geometry`` and ``--kv-mode`` take comma lists: the codecs are measured (and the CPU
    calibrated) once, every combination is simulated; with one combination the JSON is that run's, with several
    it holds them under ``results``."""
    if args.mode in ("live", "page") and str(args.json).endswith(".jsonl"):
        raise SystemExit(
            f"sakura bench e2e: --json {args.json}: a {args.mode} run writes one JSON (streaming is for "
            "sim runs); give a .json name"
        )
    if args.mode == "live":
        from .cli_live import run_live

        return run_live(args)
    if args.mode == "page":
        from .cli_page import run_page

        return run_page(args)
    from sakura_core.models.edit_model import load_demo_model

    from .e2e_ladders import load_or_measure_ladders
    from .geometry_ladders import LadderConfig

    combos = parse_combos(args)
    if args.starts < 1:
        raise SystemExit(f"sakura bench e2e: --starts must be >= 1 (reported figures use >= 3), got {args.starts}")
    try:
        synth = tuple(int(x) for x in args.synth_layers.split(",") if x.strip())
    except ValueError:
        raise SystemExit(
            f"sakura bench e2e: --synth-layers must be a comma list of layers, got {args.synth_layers!r}"
        ) from None
    scan = scan_traces(args.traces, args.trace_classes)
    for path, why in scan.skipped:
        print(f"skipped {path}: {why}")
    policies = select_policies(args.policies, "sim")
    t0 = time.perf_counter()
    print(sources_table())
    print("SIMULATION at phone scale; per-shard ladders measured on the demo model (bench/geometry_ladders.py)")
    model = None

    def demo_model():
        nonlocal model
        model = model or load_demo_model()
        return model

    calibration = None if args.no_calibrate else _calibration(demo_model(), args)
    cfg = LadderConfig(steps=args.steps, synth_layers=synth)
    pairs = list(dict.fromkeys((g, m) for m, g, _, _ in combos))
    ladders_by = load_or_measure_ladders(pairs, args.ladders, cfg, demo_model)
    header = {
        "mode": "sim",
        "label": "SIMULATION (discrete-event, phone-scale model, ladders measured on the demo model)",
        "command": "sakura bench e2e " + " ".join(_argv(args)),
        "argv": _argv(args),
        "calibration": calibration,
        "ladders": _ladder_refs(args, ladders_by),
        "skipped_traces": [{"path": p, "reason": why} for p, why in scan.skipped],
    }
    sink = open_sink(args.json, json.loads(json.dumps(header, default=float)), keep_runs=not args.no_runs)
    try:
        for c in combos:
            _simulate_combo(args, c, scan.traces, policies, ladders_by, sink)
    except BaseException:
        sink.abort()
        raise
    sink.close(round(time.perf_counter() - t0, 1))
    print(f"wrote {args.json}")
    return 0
