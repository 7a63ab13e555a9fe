"""``sakura bench planner``: the sakura policy's time per decision and per edit at growing steps x layers (4 x 25,
28 x 25, 50 x 25 by default), on this CPU. Prints a table and writes JSON."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import platform
from pathlib import Path

from sakura_core.files import atomic_write_json

from .planner_bench import bench_case, format_planner_table

__all__ = ["ROW_KEYS", "add_arguments", "read_before", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON here")
    parser.add_argument("--steps", default="4,28,50", help="comma list of step counts (default: %(default)s)")
    parser.add_argument("--policy", default="sakura", help="the policy to time (default: %(default)s)")
    parser.add_argument("--profile", default="snapdragon-8-elite-cpu", help="device profile (default: %(default)s)")
    parser.add_argument("--geometry", default="klein4b-512-ref1024", help="DiT geometry (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the synthetic random-walk link")
    parser.add_argument("--mean-mbit", type=float, default=30.0, help="the walk's starting rate, Mbit/s")
    parser.add_argument("--max-decisions", type=int, help="stop a case after this many decisions (for slow planners)")
    parser.add_argument(
        "--before", metavar="JSON", help="a planner JSON of an earlier planner, kept beside these rows"
    )


def _command(args) -> str:
    parts = [
        "sakura bench planner",
        f"--steps {args.steps}",
        f"--policy {args.policy}",
        f"--profile {args.profile}",
        f"--geometry {args.geometry}",
        f"--seed {args.seed}",
        f"--mean-mbit {args.mean_mbit:g}",
    ]
    if args.max_decisions:
        parts.append(f"--max-decisions {args.max_decisions}")
    return " ".join(parts)


ROW_KEYS = (
    "steps",
    "layers",
    "decisions",
    "ms_per_decision_mean",
    "ms_per_decision_p99",
    "ms_per_decision_max",
    "planning_s_per_edit",
    "complete",
    "planning_share_of_latency",
)


def read_before(path: str) -> dict:
    """An earlier planner's ``sakura bench planner`` JSON (its ``rows`` are kept beside the new ones); a clear
    ValueError naming the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--before {path}: not a readable JSON file ({e})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"--before {path}: no 'rows' list: give the JSON a `sakura bench planner --json` wrote")
    for i, r in enumerate(rows):
        missing = [k for k in ROW_KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise ValueError(f"--before {path}: row {i} lacks {missing}: give a `sakura bench planner` JSON")
    data.pop("before", None)  # one earlier planner, not a chain
    return data


def run(args) -> int:
    before = None
    if args.before:
        try:
            before = read_before(args.before)
        except ValueError as e:
            print(f"sakura bench planner: {e}")
            return 2
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        print(f"sakura bench planner: --steps must be a comma list of integers, got {args.steps!r}")
        return 2
    if not steps or min(steps) < 1:
        print(f"sakura bench planner: --steps needs step counts >= 1, got {args.steps!r}")
        return 2
    rows = []
    for s in steps:
        rows.append(
            bench_case(s, args.policy, args.profile, args.geometry, args.seed, args.mean_mbit, args.max_decisions)
        )
        print(
            f"{s} steps: {rows[-1]['decisions']} decisions, {rows[-1]['ms_per_decision_mean']:.2f} ms each", flush=True
        )
    print(
        f"\nsakura bench planner: policy {args.policy}, per-step KV, {args.geometry}, {args.profile}, synthetic "
        f"walk (seed {args.seed}, from {args.mean_mbit:g} Mbit/s); CPU time of the deciding thread on this host ({platform.processor() or platform.machine()})"
    )
    print(format_planner_table(rows))
    out: dict[str, object] = {
        "cpu": platform.processor() or platform.machine(),
        "rows": rows,
        "command": _command(args),
    }
    if before is not None:
        out["before"] = before
    atomic_write_json(args.json, out)
    print(f"wrote {args.json}")
    return 0
