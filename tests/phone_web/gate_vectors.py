"""The page's fetch-lane gate vectors: the request-ahead gate (:func:`~sakura_core.runtime.deferral.request_gate` and
its window, :func:`~sakura_core.runtime.deferral.ahead_window_bytes`) and the prefetch room
(:func:`~sakura_core.runtime.lane_rules.prefetch_room`), recorded where the simulator asks them in per-step edits
(``sakura_core.runtime.simulate``, requests ahead, two prefetch budgets) over synthetic links
(``sakura_core.fetch.synth`` at a seed other than the development one; never ../shared/traces). Each estimator state
the window was asked with is asked again with the bytes outstanding at 0, half the window, the window itself (the
tie), the next float above it and twice it; each room call again at its exact cap, without a budget and before a
shard size is known, so every reason is present.

``python -m tests.phone_web.gate_vectors OUT`` writes ``OUT/gate_cases.json``; ``phone_web/test/run_gate.mjs``
replays it through ``phone_web/src/lanes/lane_rules.js``."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

from sakura_core.fetch.synth import development_set
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from sakura_core.runtime import sim_link
from sakura_core.runtime.deferral import ahead_window_bytes, request_gate
from sakura_core.runtime.lane_rules import has_prefetch_room, prefetch_room
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.simulate import SimConfig, kv_mode_view, simulate

__all__ = ["GATE_FILE", "generate", "write_gate_vectors"]

GATE_FILE = "gate_cases.json"
SEED = 302  # synthetic links of every kind, a fresh seed (100 is the development set)
GEOMETRY = "klein4b-512-ref1024"
PER_RUN = {"gate": 100, "room": 60}  # cases of each call kept per simulated edit (its first ones)


def _estimator(est) -> dict:
    c = est.config
    return {
        "config": {
            "window": c.window,
            "min_sample_bytes": c.min_sample_bytes,
            "prior_bytes_per_s": c.prior_bytes_per_s,
        },
        "samples": list(est._samples),
        "errors": list(est._errors),
        "last_prediction": est._last_prediction,
        "pooled": list(est._pooled),
    }


def _gate_cases(est, rtt_s: float) -> list[dict]:
    """The gate asked at one estimator state with the bytes outstanding around its window."""
    window = ahead_window_bytes(est, rtt_s)
    lefts = [0.0, 1e5] if window is None else [0.0, window / 2, window, math.nextafter(window, math.inf), 2 * window]
    state = _estimator(est)
    out = []
    for left in lefts:
        go, reason = request_gate(est, rtt_s, left)
        out.append(
            {
                "call": "gate",
                "estimator": state,
                "rtt_s": rtt_s,
                "left": left,
                "window": window,
                "go": go,
                "reason": reason,
            }
        )
    return out


def _room_cases(g: int, running_end: int, later: int, size: int | None, cap: int | None) -> list[dict]:
    """The room asked as the simulator asked it, at the cap exactly, without a budget and with no size known."""
    calls = [
        (g, running_end, later, size, cap),
        (g, running_end, later, None, cap),
        (g, running_end, later, size, None),
    ]
    if cap is not None and size is not None:
        calls.append((g, running_end, max(cap - size, 0), size, cap))
    return [{"call": "room", "args": list(a), "go": has_prefetch_room(*a), "reason": prefetch_room(*a)} for a in calls]


def _levels(fp: int) -> list[Level]:
    """A cheap base, the floor refining it, fp16 (as the policy vectors' three levels)."""
    return [
        Level("l1", fp // 11, fp // 11, 0.05, 1e-3),
        Level("l3", fp // 5, fp // 5 - fp // 11, 0.09, 1e-6, True),
        Level("fp16", fp, fp, 0.06, 0.0),
    ]


def generate() -> list[dict]:
    """Every case: the simulator's gate and room calls (sakura and fetch-fp16, per-step KV, two prefetch budgets)."""
    base = get_profile("snapdragon-8-elite-cpu", GEOMETRY)
    fp = kv_mode_view(base, "per-step").model.shard_bytes_fp16
    n = base.model.steps * base.model.layers
    ladders = {"sakura": [_levels(fp)] * n, "fp16": [[Level("fp16", fp, fp, 0.06, 0.0)]] * n}
    cases: list[dict] = []
    seen: set[str] = set()
    run: Counter[str] = Counter()

    def keep(new: list[dict]) -> None:
        for c in new:
            key = json.dumps(c, sort_keys=True)
            if key not in seen and run[c["call"]] < PER_RUN[c["call"]]:
                seen.add(key)
                cases.append(c)
                run[c["call"]] += 1

    def window(est, rtt_s):
        keep(_gate_cases(est, rtt_s))
        return ahead_window_bytes(est, rtt_s)

    def room(g, running_end, later, size, cap):
        keep(_room_cases(g, running_end, later, size, cap))
        return has_prefetch_room(g, running_end, later, size, cap)

    saved = sim_link.ahead_window_bytes, sim_link.has_prefetch_room
    sim_link.ahead_window_bytes, sim_link.has_prefetch_room = window, room
    try:
        for i, trace in enumerate(development_set(SEED)[::3]):
            for name in ("sakura", "fetch-fp16"):
                for shards in (2, 6):
                    run.clear()
                    config = SimConfig(prefetch_kv_bytes=shards * base.model.shard_bytes_fp16)
                    start = float(i * 37 % 400)
                    simulate(
                        make_policy(name), trace, base, ladders, {"sakura": 1, "fp16": 0}, start_s=start, config=config
                    )
    finally:
        sim_link.ahead_window_bytes, sim_link.has_prefetch_room = saved
    return cases


def write_gate_vectors(out: Path) -> dict:
    """Write ``out/gate_cases.json``; the counts: cases, by call and by reason."""
    cases = generate()
    out.mkdir(parents=True, exist_ok=True)
    (out / GATE_FILE).write_text(json.dumps({"cases": cases}), encoding="utf-8")
    return {
        "cases": len(cases),
        "calls": dict(Counter(c["call"] for c in cases)),
        "reasons": dict(Counter(c["reason"] for c in cases)),
    }


if __name__ == "__main__":
    print(json.dumps(write_gate_vectors(Path(sys.argv[1]))))  # noqa: T201
