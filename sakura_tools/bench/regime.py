"""Regime maps over link rate x device speed, on constant links.

* :func:`regime_map`: which representation wins — compute on the device, fetch every shard at the floor, or the best
  hybrid split — and by how much (``sakura bench e2e`` prints it per profile unless ``--no-regime-map``).
* :func:`policy_regime`: where a policy's speed-up over a baseline holds, and where no policy could reach a target
  with these bytes (``sakura bench regime``): per cell the simulated latency of the policy, of each baseline and the
  fluid lower bound (:func:`~sakura_core.runtime.oracle.fluid_bound`); the speed-up ``baseline / policy`` beside its
  ceiling ``baseline / bound``. A target above a cell's ceiling is out of reach there for any policy on these bytes
  (the bound's device computes, its link is a fluid with no round trips and decode is free).
"""

from __future__ import annotations

from sakura_core.fetch.traces import Trace
from sakura_core.policy.policies import POLICIES, make_policy
from sakura_core.runtime.oracle import fixed_split_policy, fluid_bound, simulate_oracle
from sakura_core.runtime.profiles import DeviceProfile
from sakura_core.runtime.simulate import kv_mode_view, simulate

__all__ = ["cells_reaching", "format_policy_regime", "format_regime", "policy_regime", "regime_map"]


def regime_map(
    profile: DeviceProfile, ladders: dict, floors: dict, tflops: list[float], mbits: list[float], kv_mode="single"
) -> dict:
    """Per (device TFLOP/s, link Mbit/s): latency of compute on the device (on-device-cached; in per-step mode the
    template at every step), fetch every shard at the floor level (split 0) and the best hybrid split; the winner
    and its margin over the next best. ``ladders`` match ``kv_mode_view(profile, kv_mode)``."""
    kv_mode_view(profile, kv_mode)  # validates kv_mode; ladders have steps x layers shards in per-step mode
    L = profile.model.layers
    names = ["compute", "fetch", "hybrid"]

    def cell(prof, trace) -> dict:
        lat = [
            simulate(POLICIES["on-device-cached"](), trace, prof, ladders, floors).result.latency_s,
            simulate(fixed_split_policy(0), trace, prof, ladders, floors).result.latency_s,
            min(simulate(fixed_split_policy(k), trace, prof, ladders, floors).result.latency_s for k in range(1, L)),
        ]
        order = sorted(range(3), key=lat.__getitem__)
        return {"latency_s": lat, "winner": names[order[0]], "margin": lat[order[1]] / lat[order[0]]}

    cells = _over_grid(profile, tflops, mbits, cell)
    return {
        "tflop_per_s": list(tflops),
        "mbit_per_s": list(mbits),
        "cells": cells,
        "geometry": profile.model.name,
        "kv_mode": kv_mode,
    }


def format_regime(regime: dict) -> str:
    """Rows: device TFLOP/s; columns: link Mbit/s; cell: winner (C compute, F fetch, H hybrid) x margin."""
    mb = regime["mbit_per_s"]
    lines = [
        f"regime map ({regime['geometry']}, {regime.get('kv_mode', 'single')} KV): C = compute on device, "
        "F = fetch all, H = hybrid split; x = latency of the next best / the winner's",
        format("TFLOP/s | Mbit/s", ">17") + "".join(f"{b:>10g}" for b in mb),
    ]
    for tf, row in zip(regime["tflop_per_s"], regime["cells"], strict=True):
        lines.append(f"{tf:>17g}" + "".join(f"{c['winner'][0].upper():>3}{c['margin']:>6.2f}x" for c in row))
    return "\n".join(lines)


def policy_regime(
    profile: DeviceProfile,
    ladders: dict,
    floors: dict,
    tflops: list[float],
    mbits: list[float],
    policy: str = "sakura",
    baselines: tuple[str, ...] = ("cachegen", "on-device-cached"),
    kv_mode: str = "single",
    config=None,
    progress=None,
) -> dict:
    """Per (device TFLOP/s, link Mbit/s) on a constant link: the latency of ``policy``, of each baseline and the fluid
    lower bound (``ladders`` as :func:`~sakura_core.runtime.simulate.simulate` takes them: steps x layers shards in
    per-step ``kv_mode``); per baseline the speed-up ``baseline / policy`` and the ceiling ``baseline / bound``.
    ``config``: the simulator's settings (planning charges; the oracle runs its search as in ``sakura bench e2e``)."""
    names = (policy, *baselines)
    g = profile.model
    want = kv_mode_view(profile, kv_mode).model.layers  # validates kv_mode
    for fam, lads in ladders.items():
        if len(lads) != want:
            raise ValueError(f"{kv_mode} KV on {g.name} has {want} shards; the {fam!r} ladders list {len(lads)}")
    for n in names:
        make_policy(n)  # raises naming the choices
    if any(t <= 0 for t in tflops) or any(m <= 0 for m in mbits):
        raise ValueError(f"device TFLOP/s and link Mbit/s must be > 0, got {list(tflops)} and {list(mbits)}")
    family = make_policy(policy).family

    def cell(prof, trace) -> dict:
        lat = {
            n: float(
                (simulate_oracle if n == "oracle" else simulate)(
                    make_policy(n), trace, prof, ladders, floors, 0.0, config
                ).result.latency_s
            )
            for n in names
        }
        bound = fluid_bound(trace, prof, ladders, floors, 0.0, family)
        return {
            "latency_s": lat,
            "fluid_bound_s": bound,
            "speedup": {b: lat[b] / lat[policy] for b in baselines},
            "ceiling": {b: lat[b] / bound for b in baselines},
        }

    cells = _over_grid(profile, tflops, mbits, cell, progress)
    return {
        "tflop_per_s": list(tflops),
        "mbit_per_s": list(mbits),
        "cells": cells,
        "policy": policy,
        "baselines": list(baselines),
        "profile": profile.name,
        "profile_tflop_per_s": profile.effective_flop_per_s / 1e12,
        "geometry": g.name,
        "kv_mode": kv_mode,
    }


def _over_grid(profile: DeviceProfile, tflops: list[float], mbits: list[float], cell, progress=None) -> list[list]:
    """``cell(profile at that speed, constant trace at that rate)`` over every (TFLOP/s, Mbit/s): rows by TFLOP/s."""
    rows = []
    for tf in tflops:
        prof = profile.with_speed(tf * 1e12)
        rows.append([cell(prof, Trace.constant(mbit)) for mbit in mbits])
        if progress:
            progress(f"{tf:g} TFLOP/s: {len(mbits)} links")
    return rows


def cells_reaching(regime: dict, baseline: str, target: float, key: str = "speedup") -> list[tuple[float, float]]:
    """(TFLOP/s, Mbit/s) of the cells where ``key`` ("speedup" or "ceiling") over ``baseline`` is >= ``target``."""
    return [
        (tf, mb)
        for tf, row in zip(regime["tflop_per_s"], regime["cells"], strict=True)
        for mb, c in zip(regime["mbit_per_s"], row, strict=True)
        if c[key][baseline] >= target
    ]


def format_policy_regime(regime: dict, baseline: str, target: float | None = None) -> str:
    """Rows: device TFLOP/s (the profile's own marked *); columns: link Mbit/s; cell: ``baseline / policy`` latency
    and, in brackets, the ceiling ``baseline / fluid bound``; with ``target``, the cells reaching it counted."""
    pol, mb = regime["policy"], regime["mbit_per_s"]
    own = regime["profile_tflop_per_s"]
    lines = [
        f"{pol} vs {baseline} on constant links ({regime['geometry']}, {regime['kv_mode']} KV, {regime['profile']} "
        f"scaled to each TFLOP/s; * its own {own:g}): {baseline} latency / {pol}'s (in brackets / the fluid bound's: "
        "the ceiling, which no policy passes with these bytes)",
        format("TFLOP/s | Mbit/s", ">17") + "".join(f"{b:>16g}" for b in mb),
    ]
    for tf, row in zip(regime["tflop_per_s"], regime["cells"], strict=True):
        mark = "*" if abs(tf - own) <= 1e-9 * max(own, 1.0) else " "
        cells = "".join(f"{c['speedup'][baseline]:.2f}x ({c['ceiling'][baseline]:.2f})".rjust(16) for c in row)
        lines.append(f"{tf:>16g}{mark}{cells}")
    if target is not None:
        n = len(regime["tflop_per_s"]) * len(mb)
        got, top = cells_reaching(regime, baseline, target), cells_reaching(regime, baseline, target, "ceiling")
        lines.append(
            f">= {target:g}x vs {baseline}: {pol} in {len(got)} of {n} cells; within reach (ceiling >= "
            f"{target:g}x) in {len(top)}"
        )
    return "\n".join(lines)
