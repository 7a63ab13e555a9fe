"""``sakura bench e2e``: every policy, every trace; sim (phone scale, discrete-event) or live (real server, link,
decode and compute on this CPU). Prints a table and writes JSON (and PNG plots with ``--plots``)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

from sakura_core.fetch.traces import scan_traces
from sakura_core.kv.storage import DEFAULT_STORE_PROFILE, STORE_PROFILES
from sakura_core.policy.policies import POLICIES
from sakura_core.runtime.profiles import GEOMETRIES, PROFILES, get_profile, sources_table
from sakura_core.runtime.simulate import KV_MODES, SimConfig

from .cli_page import PAGE_TRACES
from .e2e_header import FP16_BASELINE_NOTE, sim_header, store_view
from .e2e_report import format_table, select_policies
from .e2e_stream import open_sink
from .e2e_summary import FLUID_BOUND
from .requests_flag import add_requests_argument, requests_ahead

__all__ = ["add_arguments", "run"]


def _add_page_arguments(parser) -> None:
    """``--mode page``'s own arguments (bench/cli_page.py)."""
    parser.add_argument(
        "--page-traces",
        default=",".join(PAGE_TRACES),
        help="page: trace names in --traces (default %(default)s: `sakura traces synth`'s)",
    )
    parser.add_argument("--cpu-throttle", type=float, default=4.0, help="page: CDP CPU throttle (default %(default)s)")


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
    parser.add_argument(
        "--mode",
        choices=["sim", "live", "page"],
        default="sim",
        help="page: the phone page in headless Chromium, live vs simulated (bench/cli_page.py)",
    )
    parser.add_argument(
        "--profile", default="snapdragon-8-elite-cpu", help=f"one of (sim: a comma list of) {', '.join(PROFILES)}"
    )
    parser.add_argument("--geometry", default="phone-dit-512", help=f"sim: comma list of {', '.join(GEOMETRIES)}")
    parser.add_argument(
        "--kv-mode",
        default="single",
        help=f"sim: comma list of {', '.join(KV_MODES)} (docs/design.md); live: one of them",
    )
    parser.add_argument("--no-calibrate", action="store_true", help="sim: skip the CPU calibration of the cost model")
    parser.add_argument(
        "--json",
        "--out",
        dest="json",
        required=True,
        help="write results here: FILE.jsonl streams "
        "every run as it is simulated (bench/e2e_stream.py; memory does not grow with runs), another "
        "name writes one JSON at the end (runs held in memory)",
    )
    parser.add_argument("--plots", help="folder for PNG plots")
    parser.add_argument(
        "--starts",
        type=int,
        default=3,
        help="start offsets per trace, evenly spaced over its length (sim; default "
        "%(default)s; reported figures use >= 3)",
    )
    parser.add_argument("--steps", type=int, default=4, help="edit steps (sim: for the codec measurements)")
    _add_scale_arguments(parser)
    _add_sim_model_arguments(parser)
    add_requests_argument(parser)
    parser.add_argument(
        "--no-runs", action="store_true", help="sim: leave the per-run rows out of the JSON (summaries only)"
    )
    parser.add_argument(
        "--no-regime-map",
        action="store_true",
        help="sim: skip the regime map (link Mbit/s x device TFLOP/s; "
        "its simulations on constant links outnumber the traces' runs)",
    )
    parser.add_argument(
        "--synth-layers",
        default="0,3",
        help="sim: demo layers synthesised at each geometry's shard size (the "
        "codecs' size effects; default %(default)s)",
    )
    _add_page_arguments(parser)
    _add_live_arguments(parser)


def _add_sim_model_arguments(parser) -> None:
    """What the sim charges the phone for: its ladders, its planning time, its prefetch room, the store it reads."""
    parser.add_argument(
        "--ladders",
        metavar="DIR",
        help="sim: per-shard ladder files <geometry>.<kv_mode>.json: read the ones there, "
        "measure and write the missing ones (default: measure all, keep none)",
    )
    parser.add_argument(
        "--planning",
        default="measured",
        help="sim: what each policy decision costs the phone: 'measured' (its CPU "
        "time on this host x the profile's cpu_slowdown), 'off', or a fixed number of milliseconds",
    )
    parser.add_argument(
        "--prefetch-gib",
        type=float,
        help="sim, per-step KV: the most decoded KV of later steps the phone may hold "
        "(GiB; the phone agent's prefetch room, RuntimeConfig.prefetch_kv_bytes); default: not limited",
    )
    parser.add_argument(
        "--store-profile",
        choices=STORE_PROFILES,
        default=DEFAULT_STORE_PROFILE,
        help="sim: the store profile "
        "sakura's template is published in (sakura precompute --store-profile): serving holds the rungs its rule "
        "keeps, a policy asking for another gets the nearest held one; full holds every rung and the fp16. The "
        "fetch-fp16 baseline always reads a full store's fp16 (default %(default)s)",
    )


def _add_live_arguments(parser) -> None:
    """``--mode live``'s own arguments."""
    parser.add_argument("--max-traces", type=int, default=3, help="live: traces to run (default %(default)s)")
    parser.add_argument("--shaping", choices=["inproc", "kernel"], default="inproc", help="live: link shaper")
    parser.add_argument(
        "--live-cache",
        default=None,
        metavar="DIR",
        help="live: where the precomputed template "
        "store is kept between runs, keyed by everything it depends on (default $SAKURA_CACHE_DIR "
        "or ~/.cache/sakura, then live-bench)",
    )
    parser.add_argument(
        "--no-live-cache",
        action="store_true",
        help="live: precompute the template afresh into a temporary folder (nothing kept)",
    )


def _add_scale_arguments(parser) -> None:
    """The edit's step counts and which runs keep their events (issue 50: the bench at the scale users run)."""
    parser.add_argument(
        "--edit-steps",
        help="sim: comma list of the simulated edit's step counts (default: the geometry's own, 4); "
        "per-step KV at a count with no measured per-step ladders uses the ladder model (bench/step_ladders.py)",
    )
    parser.add_argument(
        "--events",
        default="",
        help="sim: comma list of policies whose runs keep their events and decisions in the "
        "JSON (default: none; each is ~1 MB a run at phone scale)",
    )


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


def _combos(args) -> list[tuple[str, str, str, int | None]]:
    """(kv_mode, geometry, profile, edit steps or None for the geometry's own) for every combination of the comma
    lists, each name checked."""
    modes, geos, profs = (
        [x.strip() for x in a.split(",") if x.strip()] for a in (args.kv_mode, args.geometry, args.profile)
    )
    bad = [m for m in modes if m not in KV_MODES]
    if bad:
        raise SystemExit(f"sakura bench e2e: unknown --kv-mode {bad}; choose from {', '.join(KV_MODES)}")
    for p in profs:
        for g in geos:
            get_profile(p, g)  # raises naming the choices
    arg = getattr(args, "edit_steps", None)
    try:
        steps = [int(x) for x in arg.split(",") if x.strip()] if arg else [None]
    except ValueError:
        raise SystemExit(f"sakura bench e2e: --edit-steps must be a comma list of step counts, got {arg!r}") from None
    if any(s is not None and s < 2 for s in steps):
        raise SystemExit(f"sakura bench e2e: --edit-steps needs step counts >= 2, got {arg!r}")
    return [(m, g, p, n) for n in steps for m in modes for g in geos for p in profs]


def _sim_config(args, command: str = "sakura bench e2e") -> SimConfig:
    gib = getattr(args, "prefetch_gib", None)
    if gib is not None and not gib >= 0:
        raise SystemExit(f"{command}: --prefetch-gib must be >= 0 GiB, got {gib}")
    room = None if gib is None else int(gib * 2**30)
    ahead = requests_ahead(args)
    arg = str(args.planning).strip()
    if arg in ("measured", "off"):
        return SimConfig(planning=arg, prefetch_kv_bytes=room, request_ahead=ahead)
    try:
        ms = float(arg)
    except ValueError:
        raise SystemExit(f"{command}: --planning must be measured, off or milliseconds; got {arg!r}") from None
    return SimConfig(planning="fixed", planning_s=ms / 1000, prefetch_kv_bytes=room, request_ahead=ahead)


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
        profile = profile.with_geometry(replace(profile.model, steps=steps))
    g = profile.model
    print(
        f"\n===== {kv_mode} KV, {g.name}, {g.steps} steps, {profile.name} ({profile.effective_flop_per_s / 1e12:.2f} "
        f"TFLOP/s: cached step {profile.step_cached_s:.3f} s, template pass {profile.template_pass_s:.3f} s; KV "
        f"{g.kv_bytes_fp16 / 2**20:.0f} MiB fp16 per template{' per step' if kv_mode == 'per-step' else ''}) ====="
    )
    config = _sim_config(args)
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
        sub = Path(args.plots) / f"{kv_mode}.{g.name}.{profile.name}" if len(_combos(args)) > 1 else args.plots
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

    combos = _combos(args)
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
