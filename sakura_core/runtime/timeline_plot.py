"""The pipeline timeline as a PNG (matplotlib Agg): fetch / decode / compute / stall lanes of one run, and the
policy's decisions with their reasons (drops and fallbacks written out). Used by the sampler node, the demo and the
benchmarks."""

from __future__ import annotations

import textwrap
from pathlib import Path

__all__ = ["matplotlib_pyplot", "plot_timeline"]

_LANES = ["fetch", "decode", "compute", "stall"]
_MAX_NOTES = 6  # decisions written out on the plot (drops and fallbacks first); every reason is in the report
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


def _decision_kind(d: dict) -> str:
    level = d.get("level")
    if level == "drop":
        return "drop"
    if level == "device" or str(d.get("reason", "")).startswith("fallback"):
        return "fallback"
    if level is None:
        return "stop"
    if isinstance(level, int) and level < 0:
        return "compute"
    return "upgrade" if d.get("reason") == "upgrade" else "fetch"


_MARKS = {  # decision kind -> (marker, colour, legend)
    "fetch": ("|", "#4C72B0", "decision: fetch"),
    "upgrade": ("|", "#8172B3", "decision: upgrade"),
    "compute": ("x", "#7F7F7F", "decision: device computes (for now)"),
    "drop": ("v", "#C44E52", "decision: template dropped"),
    "fallback": ("*", "#C44E52", "decision: fallback"),
    "stop": ("s", "#000000", "decision: stop fetching"),
}


def _plot_decisions(ax, decisions: list[dict], row: int) -> list[str]:
    """Markers on the decisions row; the reasons of drops and fallbacks (then the rest) as numbered notes."""
    kinds = [_decision_kind(d) for d in decisions]
    for kind, (marker, color, _) in _MARKS.items():
        ts = [d["t"] for d, k in zip(decisions, kinds, strict=True) if k == kind]
        if ts:
            ax.scatter(ts, [row] * len(ts), marker=marker, color=color, s=28, zorder=3)
    key = sorted(range(len(decisions)), key=lambda i: (kinds[i] not in ("drop", "fallback"), decisions[i]["t"]))
    notes = []
    for n, i in enumerate(sorted(key[:_MAX_NOTES], key=lambda i: decisions[i]["t"]), start=1):
        d = decisions[i]
        ax.annotate(str(n), (d["t"], row), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6)
        notes.append(f"{n}: t={d['t']:.2f} s {textwrap.shorten(str(d.get('reason', '')), 150)}")
    return notes


def plot_timeline(events: list[dict], path: str | Path, title: str = "", decisions: list[dict] | None = None) -> None:
    """Fetch / decode / compute lanes of one run (template layers in a darker green); with ``decisions`` (the
    report's ``{"t", "layer", "level", "reason"}`` list) a row of decision markers and the reasons of the key ones."""
    plt = matplotlib_pyplot()
    lanes = _LANES + (["decisions"] if decisions else [])
    notes: list[str] = []
    fig, ax = plt.subplots(figsize=(10, 3.5 if decisions else 3.2))
    for lane_idx, lane in enumerate(_LANES):
        for e in (e for e in events if e["lane"] == lane):
            color = _COLORS[lane]
            if lane == "compute" and e.get("level") == "template":
                color = _TEMPLATE_GREEN
            ax.barh(lane_idx, e["end"] - e["start"], left=e["start"], color=color, edgecolor="white", linewidth=0.3)
    legend = list(_LEGEND)
    if decisions:
        notes = _plot_decisions(ax, decisions, len(_LANES))
        used = {_decision_kind(d) for d in decisions}
        legend += [(label, color) for kind, (_, color, label) in _MARKS.items() if kind in used]
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for _, color in legend]
    leg = ax.legend(
        handles,
        [name for name, _ in legend],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=3,
        fontsize=7,
        frameon=False,
    )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the edit started")
    ax.set_title(textwrap.fill(title or "pipeline timeline", 110), fontsize=9)
    fig.tight_layout()
    if notes:  # under the legend; the saved figure grows to hold them
        ax.annotate(
            "\n".join(notes),
            xy=(0, 0),
            xycoords=leg,
            xytext=(0, -4),
            textcoords="offset points",
            va="top",
            ha="left",
            fontsize=6,
            family="monospace",
        )
    fig.savefig(path, dpi=120, bbox_inches="tight" if notes else None)
    plt.close(fig)
