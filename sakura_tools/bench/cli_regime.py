"""``sakura bench regime``: where a policy's speed-up over a baseline holds, over link Mbit/s x device TFLOP/s on
constant links, beside the ceiling no policy passes with these bytes (the fluid lower bound in its place). Prints a
map per baseline and writes JSON; the ladders are ``sakura bench e2e``'s (``--ladders DIR``: read, or measured on the
demo model and written)."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import statistics
import time

from sakura_core.files import atomic_write_json
from sakura_core.runtime.profiles import GEOMETRIES, PROFILES, get_profile
from sakura_core.runtime.simulate import KV_MODES

__all__ = ["add_arguments", "run"]

TFLOPS = "0.05,0.2,1,3.5,14"  # phone CPU .. NPU
MBITS = "1,3,10,30,100,300,1000"


def add_arguments(parser) -> None:
    from .requests_flag import add_requests_argument

    parser.add_argument("--json", required=True, metavar="FILE", help="write the map as JSON here")
    parser.add_argument("--profile", default="snapdragon-8-elite-cpu", help=f"one of {', '.join(PROFILES)}")
    parser.add_argument("--geometry", default="klein4b-512-ref1024", help=f"one of {', '.join(GEOMETRIES)}")
    parser.add_argument("--kv-mode", default="per-step", choices=KV_MODES, help="default: %(default)s")
    parser.add_argument("--policy", default="sakura", help="the policy mapped (default: %(default)s)")
    parser.add_argument("--against", default="cachegen,on-device-cached", help="comma list of baselines")
    parser.add_argument("--tflops", default=TFLOPS, help="device effective TFLOP/s, comma list (default %(default)s)")
    parser.add_argument("--mbits", default=MBITS, help="link Mbit/s, comma list (default %(default)s)")
    parser.add_argument("--target", type=float, default=1.5, help="speed-up whose cells are counted (default 1.5)")
    parser.add_argument(
        "--planning",
        default="1",
        help="what each policy decision costs the phone, as sakura bench e2e: 'measured', "
        "'off' or fixed milliseconds (default %(default)s: deterministic)",
    )
    parser.add_argument(
        "--ladders",
        metavar="DIR",
        help="per-shard ladder files <geometry>.<kv_mode>.json (as sakura bench e2e): "
        "read, or measured and written (default: measured, kept nowhere)",
    )
    parser.add_argument("--steps", type=int, default=4, help="edit steps of the codec measurements (default 4)")
    parser.add_argument("--synth-layers", default="0,3", help="as sakura bench e2e (default %(default)s)")
    add_requests_argument(parser)
    parser.add_argument(
        "--traces",
        metavar="DIR",
        help="also print each trace class's median link rate (the mean over each trace), "
        "to place the classes on the map",
    )


def _floats(flag: str, text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"sakura bench regime: {flag} must be a comma list of numbers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise SystemExit(f"sakura bench regime: {flag} needs numbers > 0, got {text!r}")
    return vals


def _argv(args) -> list[str]:
    out = ["--profile", args.profile, "--geometry", args.geometry, "--kv-mode", args.kv_mode, "--policy", args.policy,
           "--against", args.against, "--tflops", args.tflops, "--mbits", args.mbits, "--target", f"{args.target:g}",
           "--steps", str(args.steps), "--synth-layers", args.synth_layers, "--planning", args.planning,
           "--requests", args.requests]  # fmt: skip # keep: flags beside their values
    for flag, val in (("--ladders", args.ladders), ("--traces", args.traces)):
        if val:
            out += [flag, val]
    return out + ["--json", args.json]


def _planning_words(config) -> str:
    if config.planning == "fixed":
        return f"{config.planning_s * 1e3:g} ms per decision (fixed)"
    return "each decision's CPU time on this host" if config.planning == "measured" else "none (--planning off)"


def class_rates(folder: str) -> dict[str, dict]:
    """Per trace class: how many traces and the median over them of each trace's mean Mbit/s."""
    from sakura_core.fetch.traces import scan_traces

    by: dict[str, list[float]] = {}
    for t in scan_traces(folder).traces:
        by.setdefault(t.trace_class or "other", []).append(t.mean_mbit_per_s)
    return {c: {"traces": len(v), "median_mean_mbit_s": statistics.median(v)} for c, v in sorted(by.items())}


def run(args) -> int:
    from sakura_core.models.edit_model import load_demo_model

    from .e2e import sim_ladders
    from .e2e_args import sim_config
    from .e2e_ladders import load_or_measure_ladders
    from .geometry_ladders import LadderConfig
    from .regime import format_policy_regime, policy_regime

    tflops, mbits = _floats("--tflops", args.tflops), _floats("--mbits", args.mbits)
    config = sim_config(args, "sakura bench regime")
    against = tuple(x.strip() for x in args.against.split(",") if x.strip())
    try:
        profile = get_profile(args.profile, args.geometry)
        synth = tuple(int(x) for x in args.synth_layers.split(",") if x.strip())
    except ValueError as e:
        raise SystemExit(f"sakura bench regime: {e}") from None
    rates = class_rates(args.traces) if args.traces else None
    t0 = time.perf_counter()
    pair = (args.geometry, args.kv_mode)
    lad = load_or_measure_ladders(
        [pair], args.ladders, LadderConfig(steps=args.steps, synth_layers=synth), load_demo_model
    )[pair]
    ladders, floors = sim_ladders(lad, args.kv_mode, profile.model)  # as sakura bench e2e's default
    try:
        regime = policy_regime(
            profile,
            ladders,
            floors,
            tflops,
            mbits,
            args.policy,
            against,
            args.kv_mode,
            config,
            progress=lambda m: print(m, flush=True),
        )
    except ValueError as e:
        raise SystemExit(f"sakura bench regime: {e}") from None
    print(f"planning charged: {_planning_words(config)}")
    for b in against:
        print()
        print(format_policy_regime(regime, b, args.target))
    if rates:
        print(
            "\ntrace classes (median over the class's traces of each trace's mean rate): "
            + "; ".join(f"{c} {r['median_mean_mbit_s']:.1f} Mbit/s ({r['traces']} traces)" for c, r in rates.items())
        )
    out = {
        **regime,
        "target": args.target,
        "planning": _planning_words(config),
        "trace_classes": rates,
        "command": "sakura bench regime " + " ".join(_argv(args)),
        "argv": _argv(args),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    atomic_write_json(args.json, json.loads(json.dumps(out, default=float)))
    print(f"wrote {args.json}")
    return 0
