"""The options of ``sakura bench e2e`` (:mod:`.cli_e2e`) and what they parse to: the combinations of KV mode,
geometry, profile and step count a sim run covers (:func:`parse_combos`) and its simulation settings (:func:`sim_config`).
"""

from __future__ import annotations

import argparse

from sakura_core.kv.storage import DEFAULT_STORE_PROFILE, STORE_PROFILES
from sakura_core.policy.policies import POLICIES
from sakura_core.runtime.profiles import GEOMETRIES, PROFILES, get_profile
from sakura_core.runtime.simulate import KV_MODES, SimConfig

from .cli_page import PAGE_TRACES
from .requests_flag import add_requests_argument, requests_ahead

__all__ = ["add_arguments", "parse_combos", "sim_config"]


def _add_page_arguments(parser) -> None:
    """``--mode page``'s own arguments (bench/cli_page.py)."""
    parser.add_argument(
        "--page-traces",
        default=",".join(PAGE_TRACES),
        help="page: trace names in --traces (default %(default)s: `sakura traces synth`'s)",
    )
    parser.add_argument("--cpu-throttle", type=float, default=4.0, help="page: CDP CPU throttle (default %(default)s)")
    parser.add_argument(
        "--page-repeats",
        type=_positive_int,
        default=3,
        help="page: edits per trace and policy, interleaved; the median one is compared (default %(default)s)",
    )


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def add_arguments(parser) -> None:
    """Every mode's options of ``sakura bench e2e`` (sim, live, page)."""
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


def parse_combos(args) -> list[tuple[str, str, str, int | None]]:
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


def sim_config(args, command: str = "sakura bench e2e") -> SimConfig:
    """The simulation settings the sim options ask for (``--planning``, ``--prefetch-gib``, ``--requests``), each
    checked (a bad one exits naming it)."""
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
