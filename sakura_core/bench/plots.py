"""Benchmark plots (PNG, matplotlib Agg): trace with chosen levels, regime map (the pipeline timeline is
:mod:`sakura_core.runtime.timeline_plot`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..runtime.timeline_plot import matplotlib_pyplot as _plt
from ..runtime.timeline_plot import plot_timeline

__all__ = ["plot_regime_map", "plot_timeline", "plot_trace_levels", "regime_map"]


def plot_trace_levels(trace, decisions: list[dict], level_names: list[str], path, start_s: float, end_s: float):
    """The link rate over the run, and each fetch decision's level (skipped = computed on the device)."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True)
    t = np.linspace(0, max(end_s, 1e-3), 400)
    a1.plot(t, [trace.rate_at(start_s + x) * 8 / 1e6 for x in t], color="#4C72B0")
    a1.set_ylabel("Mbit/s")
    a1.set_title(f"trace {trace.name} from {start_s:.0f}s")
    for d in decisions:
        lv = d.get("level")
        if isinstance(lv, int) and lv >= 0:
            y, marker = lv, "o" if d.get("reason") != "upgrade" else "^"
        elif lv == -1:
            y, marker = -1, "x"
        else:
            continue
        a2.scatter(d["t"], y, marker=marker, color="#DD8452")
    a2.set_yticks(range(-1, len(level_names)), ["device", *level_names])
    a2.set_xlabel("seconds since the edit started (o fetch, ^ upgrade, x computed on device)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def regime_map(simulate_fn, step_times_s, mbits) -> dict:
    """For each (device step time, bandwidth): latency of compute-only, fetch-only and the best hybrid split.

    ``simulate_fn(step_cached_s, mbit_per_s) -> (compute_s, fetch_s, hybrid_s)``.
    """
    grid = np.zeros((len(step_times_s), len(mbits), 3))
    for i, s in enumerate(step_times_s):
        for j, b in enumerate(mbits):
            grid[i, j] = simulate_fn(s, b)
    return {"step_times_s": list(step_times_s), "mbit_per_s": list(mbits), "latency_s": grid.tolist()}


def plot_regime_map(data: dict, path: str | Path) -> None:
    """Which of compute / fetch / hybrid wins, coloured, with the winner's speed-up over the better other one."""
    plt = _plt()
    grid = np.asarray(data["latency_s"])  # (devices, bandwidths, 3)
    winner = grid.argmin(axis=2)
    fig, ax = plt.subplots(figsize=(8, 5))
    cmap = plt.matplotlib.colors.ListedColormap(["#55A868", "#4C72B0", "#DD8452"])
    ax.imshow(winner, cmap=cmap, vmin=0, vmax=2, aspect="auto", origin="lower")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            lat = np.sort(grid[i, j])
            ax.text(j, i, f"{lat[1] / lat[0]:.2f}x", ha="center", va="center", fontsize=7, color="white")
    ax.set_xticks(range(len(data["mbit_per_s"])), [f"{b:g}" for b in data["mbit_per_s"]])
    ax.set_yticks(range(len(data["step_times_s"])), [f"{s:g}" for s in data["step_times_s"]])
    ax.set_xlabel("link Mbit/s")
    ax.set_ylabel("device seconds per denoising step")
    ax.set_title(
        "winner: green = compute on device, blue = fetch all, orange = hybrid split\n(x = speed-up over the next best)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
