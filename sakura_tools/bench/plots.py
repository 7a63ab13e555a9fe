"""Benchmark plots (PNG, matplotlib Agg): trace with chosen levels, regime map (the pipeline timeline is
:mod:`sakura_core.runtime.timeline_plot`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sakura_core.runtime.timeline_plot import matplotlib_pyplot as _plt
from sakura_core.runtime.timeline_plot import plot_timeline

__all__ = ["plot_regime_map", "plot_timeline", "plot_trace_levels"]


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


def plot_regime_map(data: dict, path: str | Path) -> None:
    """Which of compute / fetch / hybrid wins (``regime.regime_map``), coloured, with the winner's speed-up over
    the next best."""
    plt = _plt()
    names = ["compute", "fetch", "hybrid"]
    winner = np.array([[names.index(c["winner"]) for c in row] for row in data["cells"]])  # (devices, links)
    fig, ax = plt.subplots(figsize=(8, 5))
    cmap = plt.matplotlib.colors.ListedColormap(["#55A868", "#4C72B0", "#DD8452"])
    ax.imshow(winner, cmap=cmap, vmin=0, vmax=2, aspect="auto", origin="lower")
    for i, row in enumerate(data["cells"]):
        for j, c in enumerate(row):
            ax.text(j, i, f"{c['margin']:.2f}x", ha="center", va="center", fontsize=7, color="white")
    ax.set_xticks(range(len(data["mbit_per_s"])), [f"{b:g}" for b in data["mbit_per_s"]])
    ax.set_yticks(range(len(data["tflop_per_s"])), [f"{s:g}" for s in data["tflop_per_s"]])
    ax.set_xlabel("link Mbit/s")
    ax.set_ylabel("device effective TFLOP/s")
    ax.set_title(
        f"{data.get('geometry', '')} ({data.get('kv_mode', 'single')} KV): green = compute on device, blue = fetch "
        "all, orange = hybrid\n(x = speed-up over the next best)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
