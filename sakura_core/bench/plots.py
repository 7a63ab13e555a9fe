"""Benchmark plots (PNG, matplotlib Agg): pipeline timeline, trace with chosen levels, regime map."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["bandwidth_label", "plot_regime_map", "plot_timeline", "plot_trace_levels", "regime_map"]

_LANES = ["fetch", "decode", "compute", "stall"]
_COLORS = {"fetch": "#4C72B0", "decode": "#DD8452", "compute": "#55A868", "stall": "#C44E52"}
_TEMPLATE_COLOR = "#2E6B3A"  # compute lane: layers that ran the template tokens on the device
_LEGEND = (
    ("fetch", _COLORS["fetch"]),
    ("decode", _COLORS["decode"]),
    ("compute (fetched KV)", _COLORS["compute"]),
    ("compute (template on device)", _TEMPLATE_COLOR),
    ("stall", _COLORS["stall"]),
)


def bandwidth_label(spec: str) -> str:
    """A bandwidth spec as a plot title shows it: ``trace:/long/path/norway_bus_1`` -> ``trace norway_bus_1``,
    ``fixed:10`` -> ``fixed 10 Mbit/s``; anything else unchanged."""
    kind, _, arg = spec.partition(":")
    if kind == "trace" and arg:
        return f"trace {Path(arg).name}"
    if kind == "fixed" and arg:
        return f"fixed {arg} Mbit/s"
    return spec


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(events: list[dict], path: str | Path, title: str = "") -> None:
    """Fetch / decode / compute lanes of one run (template layers in a darker green)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for lane_idx, lane in enumerate(_LANES):
        for e in (e for e in events if e["lane"] == lane):
            color = _COLORS[lane]
            if lane == "compute" and e.get("level") == "template":
                color = _TEMPLATE_COLOR
            ax.barh(lane_idx, e["end"] - e["start"], left=e["start"], color=color, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(_LANES)), _LANES)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the edit started")
    ax.set_title(title or "pipeline timeline")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for _, color in _LEGEND]
    ax.legend(handles, [name for name, _ in _LEGEND], loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=5,
              fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
