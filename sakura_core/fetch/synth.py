"""Synthetic link traces for developing fetch policies without tuning them to the recorded ones.

Two generators, both deterministic given a seed: a geometric random walk of the rate (per-second log-normal steps,
clipped to 0.2 .. 400 Mbit/s) and an on/off link (exponential holding times, a high and a low rate — a low rate of 0
is an outage). :func:`development_set` is the set the ``sakura`` policy's rules were chosen on (random walks from
1.5 to 100 Mbit/s, on/off links with outages); ``sakura traces synth`` writes it (or any seed of it) as Pensieve-format
files, so ``sakura bench e2e --traces DIR`` runs on it.

:func:`slow_set` is the slow-link development set (issue 50 item 4): 3G-like links (:func:`slow_walk`: a
mean-reverting per-second walk around 0.5-3 Mbit/s with outages) and Oboe-like ones (:func:`oboe_like`: stable
segments of a few seconds at 1-20 Mbit/s with jumps between them); their parameters are :data:`SLOW_WALKS` and
:data:`OBOE_LIKE`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .traces import Trace

__all__ = [
    "OBOE_LIKE",
    "ON_OFF",
    "SLOW_WALKS",
    "WALKS",
    "development_set",
    "oboe_like",
    "on_off",
    "random_walk",
    "slow_set",
    "slow_walk",
    "write_pensieve",
]

WALK_FLOOR_MBIT, WALK_CEIL_MBIT = 0.2, 400.0
# (mean Mbit/s, per-second log sigma): slow, LTE-like and 5G-like walks, calm to very volatile
WALKS = [(5, 0.1), (20, 0.1), (50, 0.1), (10, 0.3), (30, 0.3), (80, 0.3), (20, 0.5), (60, 0.5), (35, 0.2), (40, 0.4),
         (1.5, 0.3), (3, 0.5), (2, 0.2), (6, 0.4), (30, 0.8), (100, 0.6)]  # fmt: skip # keep: a table of walks
# (high Mbit/s, low Mbit/s, mean holding time s): links with slumps and outages (low 0)
ON_OFF = [(50, 1, 30), (20, 0, 20), (100, 5, 60), (10, 0.5, 10), (60, 0, 15), (3, 0.2, 20), (150, 0, 20),
          (300, 2, 10), (80, 0, 40)]  # fmt: skip # keep: a table of (high, low, hold s) links


def random_walk(seed: int, mean_mbit: float, sigma: float, seconds: int = 900) -> Trace:
    """A per-second geometric random walk of the rate starting at ``mean_mbit`` (log steps N(0, sigma))."""
    if mean_mbit <= 0 or sigma < 0 or seconds < 2:
        raise ValueError(
            f"random_walk needs mean_mbit > 0, sigma >= 0, seconds >= 2; got {mean_mbit}, {sigma}, {seconds}"
        )
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0, sigma, seconds)
    x, lo, hi, out = np.log(mean_mbit), np.log(WALK_FLOOR_MBIT), np.log(WALK_CEIL_MBIT), np.empty(seconds)
    for i, s in enumerate(steps):
        x = min(max(x + s, lo), hi)
        out[i] = np.exp(x)
    return Trace(f"walk{seed}-{mean_mbit:g}-{sigma:g}", np.full(seconds, 1.0), out * 1e6 / 8)


def on_off(seed: int, high_mbit: float, low_mbit: float, mean_hold_s: float, seconds: float = 2000.0) -> Trace:
    """Alternating ``high_mbit`` / ``low_mbit`` periods (starting high) with exponential durations."""
    if high_mbit <= 0 or low_mbit < 0 or mean_hold_s <= 0:
        raise ValueError(
            f"on_off needs high_mbit > 0, low_mbit >= 0, mean_hold_s > 0; got {high_mbit}, {low_mbit}, {mean_hold_s}"
        )
    rng = np.random.default_rng(seed)
    durations, rates, total, high = [], [], 0.0, True
    while total < seconds:
        d = max(float(rng.exponential(mean_hold_s)), 0.05)
        durations.append(d)
        rates.append((high_mbit if high else low_mbit) * 1e6 / 8)
        total += d
        high = not high
    return Trace(f"onoff{seed}-{high_mbit:g}-{low_mbit:g}", np.array(durations), np.array(rates))


def development_set(seed: int = 100) -> list[Trace]:
    """Every walk of :data:`WALKS` and every link of :data:`ON_OFF`, seeded from ``seed`` (the policy's constants
    were chosen on seed 100; other seeds give fresh traces of the same kinds, for checks it was not tuned on)."""
    walks = [random_walk(seed + i, m, s) for i, (m, s) in enumerate(WALKS)]
    links = [on_off(seed + i, h, lo, d) for i, (h, lo, d) in enumerate(ON_OFF)]
    return walks + links


# 3G-like: (mean Mbit/s, per-second log sigma, outages per minute, mean outage s); the walk reverts to its mean
# (log AR(1), 10 % a second) and is clipped to SLOW_FLOOR_MBIT .. SLOW_CEIL_MBIT
SLOW_WALKS = [(0.5, 0.2, 0.5, 3), (0.8, 0.3, 1, 2), (1, 0.15, 0.3, 5), (1.5, 0.3, 1, 3), (2, 0.2, 0.5, 2),
              (3, 0.3, 1, 4), (1.2, 0.4, 2, 2), (2.5, 0.1, 0.2, 8)]  # fmt: skip # keep: a table of 3G-like walks
SLOW_FLOOR_MBIT, SLOW_CEIL_MBIT = 0.05, 8.0
# Oboe-like: (low Mbit/s, high Mbit/s, mean segment s); each segment's rate log-uniform in [low, high]
OBOE_LIKE = [(1, 20, 3), (2, 10, 5), (1, 5, 4), (5, 20, 8), (1, 8, 2), (3, 15, 6), (1, 20, 10), (2, 6, 3)]


def slow_walk(
    seed: int, mean_mbit: float, sigma: float, outages_per_min: float, outage_s: float, seconds: int = 1200
) -> Trace:
    """A 3G-like link: a per-second log walk reverting to ``mean_mbit`` (10 % of the gap a second, log steps
    N(0, sigma)), clipped to 0.05 .. 8 Mbit/s, with outages (rate 0) starting at ``outages_per_min`` a minute and
    lasting exponential times of mean ``outage_s``."""
    if mean_mbit <= 0 or sigma < 0 or outages_per_min < 0 or outage_s <= 0 or seconds < 2:
        raise ValueError(
            f"slow_walk needs mean_mbit > 0, sigma >= 0, outages_per_min >= 0, outage_s > 0, seconds "
            f">= 2; got {mean_mbit}, {sigma}, {outages_per_min}, {outage_s}, {seconds}"
        )
    rng = np.random.default_rng(seed)
    mu, lo, hi = np.log(mean_mbit), np.log(SLOW_FLOOR_MBIT), np.log(SLOW_CEIL_MBIT)
    x, out = mu, np.empty(seconds)
    for i, s in enumerate(rng.normal(0.0, sigma, seconds)):
        x = min(max(x + 0.1 * (mu - x) + s, lo), hi)
        out[i] = np.exp(x)
    t = float(rng.exponential(60.0 / outages_per_min)) if outages_per_min else float(seconds)
    while t < seconds - 1:
        end = min(t + max(float(rng.exponential(outage_s)), 1.0), seconds - 1)
        out[int(t) : int(np.ceil(end))] = 0.0
        t = end + float(rng.exponential(60.0 / outages_per_min))
    name = f"slow{seed}-{mean_mbit:g}-{sigma:g}-{outages_per_min:g}x{outage_s:g}"
    return Trace(name, np.full(seconds, 1.0), out * 1e6 / 8)


def oboe_like(seed: int, low_mbit: float, high_mbit: float, mean_segment_s: float, seconds: float = 1200.0) -> Trace:
    """An Oboe-like link: stable segments (exponential durations of mean ``mean_segment_s``, at least 0.5 s) each at
    a rate drawn log-uniform in [``low_mbit``, ``high_mbit``], jumping between them."""
    if not 0 < low_mbit <= high_mbit or mean_segment_s <= 0:
        raise ValueError(
            f"oboe_like needs 0 < low_mbit <= high_mbit and mean_segment_s > 0; got {low_mbit}, "
            f"{high_mbit}, {mean_segment_s}"
        )
    rng = np.random.default_rng(seed)
    durations, rates, total = [], [], 0.0
    while total < seconds:
        d = max(float(rng.exponential(mean_segment_s)), 0.5)
        durations.append(d)
        rates.append(float(np.exp(rng.uniform(np.log(low_mbit), np.log(high_mbit)))) * 1e6 / 8)
        total += d
    return Trace(f"oboe{seed}-{low_mbit:g}-{high_mbit:g}-{mean_segment_s:g}", np.array(durations), np.array(rates))


def slow_set(seed: int = 300) -> dict[str, list[Trace]]:
    """The slow-link development set by class: ``{"3G": [slow walks], "broadband": [Oboe-like links]}`` (the rules
    for slow links were chosen on seed 300; other seeds give fresh traces of the same kinds)."""
    return {
        "3G": [slow_walk(seed + i, *p) for i, p in enumerate(SLOW_WALKS)],
        "broadband": [oboe_like(seed + 50 + i, *p) for i, p in enumerate(OBOE_LIKE)],
    }


def write_pensieve(trace: Trace, path: str | Path) -> Path:
    """``trace`` as Pensieve lines ``time_s Mbit/s``, one per segment start, plus one at the end repeating the last
    rate (the reader gives the last line the median gap, so every segment of ``trace`` keeps its duration)."""
    path = Path(path)
    ends = np.cumsum(trace.durations_s)
    starts = np.concatenate([[0.0], ends])
    rates = np.append(trace.rates_bytes_per_s, trace.rates_bytes_per_s[-1])
    lines = [f"{t:.3f} {r * 8 / 1e6:.6f}" for t, r in zip(starts, rates, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path
