"""The slow-link table (issue 50 item 4): per (KV mode, geometry, profile) and trace class, sakura against the fluid
lower bound (median / worst), against the oracle (median / worst) and against the best policy that fetches nothing
(worst), from ``sakura bench e2e`` runs; and the runs furthest from the bound, with sakura's and the oracle's splits
side by side (where the gap is)."""

from __future__ import annotations

import statistics

from .e2e_summary import FETCH_NOTHING, FLUID_BOUND

__all__ = ["SLOW_TARGETS", "format_slow_table", "format_worst_runs", "slow_link_rows", "worst_runs"]

# the targets: sakura / fluid bound median, sakura / oracle worst, sakura / fetch-nothing worst
SLOW_TARGETS = {"bound_median": 1.05, "oracle_worst": 1.3, "nothing_worst": 1.02}


def _by_run(runs: list[dict]) -> dict[tuple, dict]:
    by: dict[tuple, dict] = {}
    for r in runs:
        by.setdefault((r["trace"], r["start_s"]), {})[r["policy"]] = r
    return by


def _nothing(row: dict) -> float | None:
    lat = [row[p]["latency_s"] for p in FETCH_NOTHING if p in row]
    return min(lat) if lat else None


def slow_link_rows(results: list[dict]) -> list[dict]:
    """One row per (kv_mode, geometry, profile, class) of e2e ``results`` (each with its ``runs``): the ratios'
    medians and worst runs, and whether the issue's targets (:data:`SLOW_TARGETS`) hold."""
    out = []
    for res in results:
        classes = sorted({r.get("trace_class", "other") for r in res["runs"]})
        for cls in classes:
            by = _by_run([r for r in res["runs"] if r.get("trace_class", "other") == cls])
            rows = [row for row in by.values() if "sakura" in row and FLUID_BOUND in row]
            bound = [row["sakura"]["latency_s"] / row[FLUID_BOUND]["latency_s"] for row in rows]
            orc = [row["sakura"]["latency_s"] / row["oracle"]["latency_s"] for row in rows if "oracle" in row]
            obound = [row["oracle"]["latency_s"] / row[FLUID_BOUND]["latency_s"] for row in rows if "oracle" in row]
            nothing = [row["sakura"]["latency_s"] / n for row in rows if (n := _nothing(row))]
            row = {
                "kv_mode": res["kv_mode"],
                "geometry": res["geometry"],
                "profile": res["profile"],
                "class": cls,
                "runs": len(rows),
                "sakura_vs_bound": _pair(bound),
                "sakura_vs_oracle": _pair(orc),
                "oracle_vs_bound": _pair(obound),
                "sakura_vs_nothing": _pair(nothing),
            }
            row["targets_met"] = {
                "bound_median": bool(bound) and statistics.median(bound) <= SLOW_TARGETS["bound_median"],
                "oracle_worst": bool(orc) and max(orc) <= SLOW_TARGETS["oracle_worst"],
                "nothing_worst": bool(nothing) and max(nothing) <= SLOW_TARGETS["nothing_worst"],
            }
            out.append(row)
    return out


def _pair(xs: list[float]) -> dict | None:
    return {"median": statistics.median(xs), "worst": max(xs)} if xs else None


def format_slow_table(rows: list[dict]) -> str:
    """The rows as a markdown table (median / worst per ratio; a '*' marks a missed target)."""

    def cell(p, target_key=None, row=None, which="median"):
        if p is None:
            return "-"
        miss = target_key is not None and not row["targets_met"][target_key]
        text = f"{p['median']:.3f} / {p['worst']:.3f}"
        return text + (" *" if miss else "")

    lines = [
        "| KV mode, geometry, profile | class | runs | sakura / fluid bound | sakura / oracle | oracle / fluid bound "
        "| sakura / fetch-nothing |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kv_mode']}, {r['geometry']}, {r['profile'].removeprefix('snapdragon-8-elite-')} | {r['class']} | "
            f"{r['runs']} | {cell(r['sakura_vs_bound'], 'bound_median', r)} | "
            f"{cell(r['sakura_vs_oracle'], 'oracle_worst', r)} | {cell(r['oracle_vs_bound'])} | "
            f"{cell(r['sakura_vs_nothing'], 'nothing_worst', r)} |"
        )
    t = SLOW_TARGETS
    lines.append(
        f"\nCells: median / worst over every run of the class; * a missed target (sakura / fluid bound "
        f"median <= {t['bound_median']}, sakura / oracle worst <= {t['oracle_worst']}, sakura / fetch-nothing "
        f"worst <= {t['nothing_worst']})."
    )
    return "\n".join(lines)


def worst_runs(results: list[dict], n: int = 5) -> list[dict]:
    """The ``n`` runs of each result with the largest sakura / fluid bound: the splits and bytes of sakura and the
    oracle beside the bound."""
    out = []
    for res in results:
        rows = [row for row in _by_run(res["runs"]).values() if "sakura" in row and FLUID_BOUND in row]
        rows.sort(key=lambda row: row["sakura"]["latency_s"] / row[FLUID_BOUND]["latency_s"], reverse=True)
        for row in rows[:n]:
            s, b, o = row["sakura"], row[FLUID_BOUND], row.get("oracle")
            out.append(
                {
                    "profile": res["profile"],
                    "trace": s["trace"],
                    "class": s.get("trace_class", "other"),
                    "start_s": s["start_s"],
                    "bound_s": b["latency_s"],
                    "sakura_s": s["latency_s"],
                    "sakura_splits": s["splits"],
                    "sakura_mb": s["bytes_fetched"] / 1e6,
                    "oracle_s": o["latency_s"] if o else None,
                    "oracle_splits": o["splits"] if o else None,
                    "oracle_mb": o["bytes_fetched"] / 1e6 if o else None,
                    "nothing_s": _nothing(row),
                }
            )
    return out


def format_worst_runs(rows: list[dict]) -> str:
    lines = ["profile | trace @ start | bound s | sakura s (splits, MB) | oracle s (splits, MB) | fetch-nothing s"]
    for r in rows:
        orc = "-" if r["oracle_s"] is None else f"{r['oracle_s']:.1f} ({r['oracle_splits']}, {r['oracle_mb']:.0f})"
        lines.append(
            f"{r['profile'].removeprefix('snapdragon-8-elite-')} | {r['trace']} @ {r['start_s']:g} | "
            f"{r['bound_s']:.1f} | {r['sakura_s']:.1f} ({r['sakura_splits']}, {r['sakura_mb']:.0f}) | {orc} | "
            f"{r['nothing_s']:.1f}"
        )
    return "\n".join(lines)
