"""End-to-end benchmark: every policy over every trace (simulation at phone scale) or over a shaped link (live).

``sim`` mode is a SIMULATION: every policy runs over every trace with a device profile on the geometry's per-shard
ladders (:mod:`sakura_core.runtime.sim_ladders`, measured by :mod:`.geometry_ladders`; per-step sakura ladders from
the cross-step measurement, :func:`cross_step_sakura`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sakura_core.fetch.traces import Trace
from sakura_core.metrics import psnr_tokens as psnr_db
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.oracle import fluid_bound, simulate_oracle
from sakura_core.runtime.profiles import DeviceProfile, DitGeometry
from sakura_core.runtime.simulate import SimConfig, kv_mode_view, simulate

from .e2e_summary import FLUID_BOUND, summarize, summarize_by_class  # the summaries: re-exported here

__all__ = [
    "cross_step_sakura",
    "quality_floor",
    "psnr_db",
    "run_sim",
    "sim_ladders",
    "summarize",
    "summarize_by_class",
]

logger = logging.getLogger(__name__)

PSNR_TARGET_DB = 35.0


def quality_floor(psnr_db_by_level: list[float], target_db: float) -> int:
    """Index of the cheapest level (levels listed cheapest first) whose PSNR meets ``target_db``; if none does,
    the level with the highest PSNR (the closest any representation of that codec gets)."""
    if not psnr_db_by_level:
        raise ValueError("quality_floor needs at least one level")
    ok = [i for i, p in enumerate(psnr_db_by_level) if p >= target_db]
    if ok:
        return ok[0]
    best = max(range(len(psnr_db_by_level)), key=psnr_db_by_level.__getitem__)
    logger.warning(
        "no level reaches %.1f dB (best %.1f dB): floor at the best level", target_db, psnr_db_by_level[best]
    )
    return best


def sim_ladders(
    lad, kv_mode: str, geometry: DitGeometry, per_step_ladders: str = "measured", data: dict | None = None
) -> tuple[dict, dict]:
    """(ladders, floors) of every family as the simulator takes them for ``lad`` (a geometry's
    :class:`~sakura_core.runtime.sim_ladders.ShardLadders`); in per-step mode with ``per_step_ladders == "measured"``
    sakura's are the cross-step coded ones (:func:`cross_step_sakura`, on ``data``: default the shipped 4-step
    measurement), else the single-mode ratios per step."""
    ladders, floors = lad.for_simulator()
    if kv_mode == "per-step" and per_step_ladders == "measured":
        ladders["sakura"], floors["sakura"] = cross_step_sakura(lad, geometry, data)
    return ladders, floors


def cross_step_sakura(lad, geometry: DitGeometry, data: dict | None = None) -> tuple[list, int | list[int]]:
    """SAKURA's per-step ladders (steps x layers shards of ``geometry``) from the per-step measurement ``data``
    (default: the one shipped in ``per_step_ladders.json``; cross-step coded per-step KV: step s's bytes and the PSNR
    of every level), each level's decode time from ``lad`` (the geometry's
    :class:`~sakura_core.runtime.sim_ladders.ShardLadders`: its sakura family at the same level name); and the floor
    (cheapest level with PSNR >= 35 dB on its track: its closed-loop twins' PSNR where it has them) — one per shard
    when the zero-byte reuse rung reaches it too (steps >= 1 then start with that rung, their floor)."""
    from sakura_core.policy.ladder import with_track_floor

    from .per_step_ladders import load, per_step_ladders, reuse_eligible, reuse_floors, track_psnr_db

    data = load() if data is None else data
    if data["steps"] != geometry.steps:
        raise ValueError(
            f"per_step_ladders.json is measured for {data['steps']} steps, {geometry.name} runs "
            f"{geometry.steps}: measure it for this schedule or use --per-step-ladders single"
        )
    fam = lad.families["sakura"]
    speed = {name: geometry.shard_bytes_fp16 / fam.decode_s[0][j] for j, name in enumerate(fam.levels)}
    missing = [lv["name"] for lv in data["levels"] if lv["name"] not in speed]
    if missing:
        raise ValueError(
            f"per_step_ladders.json names levels {missing} the {lad.geometry} ladders do not have "
            f"({list(fam.levels)}): re-measure the ladders (delete the file) or per_step_ladders.json"
        )
    ladders = per_step_ladders(data, geometry.shard_bytes_fp16, geometry.layers, speed, PSNR_TARGET_DB)
    floor = quality_floor([track_psnr_db(lv) for lv in data["levels"]], PSNR_TARGET_DB)
    open_floor = quality_floor([lv["psnr_db"] for lv in data["levels"]], PSNR_TARGET_DB)
    if open_floor > floor:  # off its track a level below the open-loop floor is fetched at that floor
        ladders = with_track_floor(ladders, data["levels"][open_floor]["name"])
    if reuse_eligible(data, PSNR_TARGET_DB):
        return ladders, reuse_floors(data, geometry.layers, floor)
    return ladders, floor


def run_sim(
    traces: list[Trace],
    policies: list[str],
    profile: DeviceProfile,
    ladders: dict,
    floors: dict,
    starts_per_trace: int = 3,
    progress=None,
    kv_mode: str = "single",
    config: SimConfig | None = None,
    keep_results: tuple[str, ...] = (),
    on_run=None,
) -> list[dict]:
    """Every policy on every trace at ``starts_per_trace`` evenly spaced start offsets (the trace's length split in
    equal parts). ``ladders`` must match the shard count (``kv_mode_view(profile, kv_mode).model``: steps x layers
    shards in per-step mode); the simulator runs the real protocol on ``profile`` (one split per step in per-step
    mode) with ``config`` (planning charges). Each (trace, start) also gets a ``fluid-bound`` row: the fluid lower
    bound (:func:`~sakura_core.runtime.oracle.fluid_bound`). A run's row holds its figures only; its whole
    :class:`~sakura_core.runtime.sim_types.SimResult` (events, decisions: ~1 MB a run at phone scale) is kept as
    ``_result`` only for the policies in ``keep_results`` (plots), and only their runs record events
    (``SimConfig.events``), so memory does not grow with the runs. ``on_run(row)``, when given, sees each row as it
    is made (``_result`` still in it: ``sakura bench e2e --json FILE.jsonl`` streams it, events where asked); a row's
    ``_result`` is then kept only for the policies in ``keep_results`` that ``on_run`` leaves it in."""
    kv_mode_view(profile, kv_mode)  # validates kv_mode
    quiet = replace(config or SimConfig(), events=False)  # the runs whose events nobody draws keep none
    runs = []
    for trace in traces:
        for i in range(starts_per_trace):
            start = trace.period_s * i / starts_per_trace
            bound = fluid_bound(trace, profile, ladders, floors, start)  # per-step: a prefix per step, not the edit
            runs.append(
                {
                    "trace": trace.name,
                    "trace_class": trace.trace_class or "other",
                    "start_s": round(start, 3),
                    "policy": FLUID_BOUND,
                    "latency_s": bound,
                    "bytes_fetched": 0,
                    "psnr_db": float("nan"),
                    "split_layer": 0,
                    "splits": [],
                    "peak_kv_bytes": 0,
                }
            )
            if on_run is not None:
                on_run(runs[-1])
            for name in policies:
                pol = make_policy(name)
                sim = simulate_oracle if name == "oracle" else simulate
                r = sim(pol, trace, profile, ladders, floors, start, config if name in keep_results else quiet)
                runs.append(
                    {
                        "trace": trace.name,
                        "trace_class": trace.trace_class or "other",
                        "start_s": round(start, 3),
                        "policy": name,
                        "latency_s": float(r.result.latency_s),
                        "bytes_fetched": int(r.result.bytes_fetched),
                        "psnr_db": float(r.psnr_db),
                        "split_layer": int(r.result.split_layer),
                        "splits": [int(k) for k in r.splits],  # one per step in per-step mode
                        "peak_kv_bytes": int(r.result.peak_kv_bytes),  # decoded template KV held at once, at most
                        "planning_s": float(r.cpu.planning_s),  # the phone's time charged for the decisions
                        "decisions": int(r.cpu.decisions_timed),
                        "contention_s": float(r.cpu.contention_s),  # the DiT's loss to decode / planning threads
                    }
                )
                if name in keep_results:
                    runs[-1]["_result"] = r
                if on_run is not None:
                    on_run(runs[-1])
        if progress:
            progress(f"trace {trace.name}: {len(policies)} policies x {starts_per_trace} starts")
    return runs
