"""The pipeline timeline as a PNG (matplotlib Agg): fetch / decode / compute / stall lanes of one run. Used by the
sampler node, the demo and the benchmarks."""

from __future__ import annotations

import textwrap
from pathlib import Path

__all__ = ["matplotlib_pyplot", "plot_timeline"]

_LANES = ["fetch", "decode", "compute", "stall"]
_COLORS = {"fetch": "#4C72B0", "decode": "#DD8452", "compute": "#55A868", "stall": "#C44E52"}
_TEMPLATE_GREEN = "#2E6B3A"  # compute lane: layers that ran the template tokens on the device
_LEGEND = (
    ("fetch", _COLORS["fetch"]),
    ("decode", _COLORS["decode"]),
    ("compute (template KV injected: fetched or kept)", _COLORS["compute"]),
    ("compute (template tokens on the device)", _TEMPLATE_GREEN),
    ("stall", _COLORS["stall"]),
)


def matplotlib_pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(events: list[dict], path: str | Path, title: str = "") -> None:
    """Fetch / decode / compute lanes of one run (template layers in a darker green)."""
    plt = matplotlib_pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for lane_idx, lane in enumerate(_LANES):
        for e in (e for e in events if e["lane"] == lane):
            color = _COLORS[lane]
            if lane == "compute" and e.get("level") == "template":
                color = _TEMPLATE_GREEN
            ax.barh(lane_idx, e["end"] - e["start"], left=e["start"], color=color, edgecolor="white", linewidth=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for _, color in _LEGEND]
    ax.legend(handles, [name for name, _ in _LEGEND], loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=3,
              fontsize=7, frameon=False)  # fmt: skip
    ax.set_yticks(range(len(_LANES)), _LANES)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the edit started")
    ax.set_title(textwrap.fill(title or "pipeline timeline", 110), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
