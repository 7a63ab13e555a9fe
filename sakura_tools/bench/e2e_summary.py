"""The e2e benchmark's summaries: per policy medians, per-run ratios vs sakura, and per trace class the headline
figures (sakura vs the oracle, the speed-ups, the worst case vs fetching nothing, the fluid lower bound)."""

from __future__ import annotations

import math
import statistics

import numpy as np

from sakura_core.policy.policies import POLICIES

__all__ = ["FETCH_NOTHING", "FLUID_BOUND", "format_headline", "headline", "summarize", "summarize_by_class"]

FLUID_BOUND = "fluid-bound"  # the pseudo-policy rows of the fluid lower bound
FETCH_NOTHING = ("on-device", "on-device-cached")
SPEEDUP_OVER = ("on-device", "on-device-cached", "cachegen", "fetch-fp16", "throughput", "cachegen-no-floor")


def _order(name: str) -> int:
    return list(POLICIES).index(name) if name in POLICIES else len(POLICIES)


def summarize_by_class(runs: list[dict]) -> dict[str, dict]:
    """:func:`summarize` and :func:`headline` per trace class (3G, 4G, broadband, 5G, other; classes with no run
    left out), plus "all"."""
    from sakura_core.fetch.trace_classes import TRACE_CLASSES

    out = {}
    for cls in (*TRACE_CLASSES, "all"):
        sub = runs if cls == "all" else [r for r in runs if r.get("trace_class", "other") == cls]
        if sub:
            summary, ratios = summarize(sub)
            out[cls] = {
                "traces": len({r["trace"] for r in sub}),
                "summary": summary,
                "ratios_vs_sakura": ratios,
                "headline": headline(sub),
            }
    return out


def summarize(runs: list[dict]) -> tuple[dict, dict]:
    """Per policy: median / p90 latency, median PSNR, median peak of the template KV held; and per-run latency
    ratios vs sakura."""
    summary, ratios = {}, {}
    by_key = {(r["trace"], r["start_s"], r["policy"]): r for r in runs}
    for name in sorted({r["policy"] for r in runs}, key=_order):
        lat = [r["latency_s"] for r in runs if r["policy"] == name]
        summary[name] = {
            "median_latency_s": statistics.median(lat),
            "p90_latency_s": float(np.percentile(lat, 90)),
            "median_psnr_db": statistics.median(r["psnr_db"] for r in runs if r["policy"] == name),
            "median_peak_kv_bytes": statistics.median(r.get("peak_kv_bytes", 0) for r in runs if r["policy"] == name),
        }
        rel = [
            r["latency_s"] / by_key[(r["trace"], r["start_s"], "sakura")]["latency_s"]
            for r in runs
            if r["policy"] == name and (r["trace"], r["start_s"], "sakura") in by_key
        ]
        if rel:
            ratios[name] = {
                "median_ratio_vs_sakura": statistics.median(rel),
                "min_ratio_vs_sakura": min(rel),
                "max_ratio_vs_sakura": max(rel),
            }
    return summary, ratios


def _ratios(by: dict, num: str, den) -> list[float]:
    """Per (trace, start): latency of ``num`` over latency of ``den`` (a policy, or a function of the row dict)."""
    out = []
    for row in by.values():
        d = den(row) if callable(den) else (row[den]["latency_s"] if den in row else None)
        if num in row and d:
            out.append(row[num]["latency_s"] / d)
    return out


def _stats(xs: list[float]) -> dict | None:
    return {"median": statistics.median(xs), "worst": max(xs), "best": min(xs)} if xs else None


def headline(runs: list[dict]) -> dict:
    """The headline figures docs/results.md quotes, over every (trace, start) of ``runs``."""
    by: dict[tuple, dict] = {}
    for r in runs:
        by.setdefault((r["trace"], r["start_s"]), {})[r["policy"]] = r

    def nothing(row):
        lat = [row[p]["latency_s"] for p in FETCH_NOTHING if p in row]
        return min(lat) if lat else None

    starts = [len({s for (t, s) in by if t == trace}) for trace in {t for (t, _) in by}]
    sak = [row["sakura"]["psnr_db"] for row in by.values() if "sakura" in row]
    bounds = [row[FLUID_BOUND]["latency_s"] for row in by.values() if FLUID_BOUND in row]
    return {
        "runs": len(by),
        "traces": len(starts),
        "starts_per_trace": min(starts) if starts else 0,
        "sakura_vs_oracle": _stats(_ratios(by, "sakura", "oracle")),
        "speedup_median": {p: statistics.median(x) for p in SPEEDUP_OVER if (x := _ratios(by, p, "sakura"))},
        # the speed-up no policy can pass with these bytes: the fluid lower bound's over each baseline
        "speedup_ceiling_median": {
            p: statistics.median(x) for p in SPEEDUP_OVER if (x := _ratios(by, p, FLUID_BOUND))
        },
        "sakura_vs_fetch_nothing": _stats(_ratios(by, "sakura", nothing)),
        "fluid_bound_median_s": statistics.median(bounds) if bounds else None,
        "sakura_vs_fluid": _stats(_ratios(by, "sakura", FLUID_BOUND)),
        "oracle_vs_fluid": _stats(_ratios(by, "oracle", FLUID_BOUND)),
        "sakura_psnr_db_median": statistics.median(sak) if sak else None,
    }


def format_headline(h: dict) -> str:
    """The headline in words, one line per figure ("-" where a policy was not run)."""

    def pair(s):
        return "-" if s is None else f"{s['median']:.3f} / {s['worst']:.3f}"

    sp = ", ".join(f"{p} {x:.2f}x" for p, x in h["speedup_median"].items()) or "-"
    ceiling = ", ".join(f"{p} {x:.2f}x" for p, x in h.get("speedup_ceiling_median", {}).items()) or "-"
    psnr = h["sakura_psnr_db_median"]
    fb = h["fluid_bound_median_s"]
    return "\n".join(
        [
            f"runs: {h['runs']} ({h['traces']} traces x >= {h['starts_per_trace']} start offsets)",
            f"sakura / oracle (median / worst): {pair(h['sakura_vs_oracle'])}",
            f"sakura's speed-up (median of per-run ratios): {sp}",
            f"ceiling: the fluid bound's speed-up (no policy passes it with these bytes): {ceiling}",
            f"sakura / best fetch-nothing policy (median / worst): {pair(h['sakura_vs_fetch_nothing'])}",
            f"fluid lower bound: median {'-' if fb is None else f'{fb:.1f} s'}; sakura / bound {pair(h['sakura_vs_fluid'])}"
            f"; oracle / bound {pair(h['oracle_vs_fluid'])}",
            f"sakura PSNR median: {'-' if psnr is None or math.isnan(psnr) else f'{psnr:.1f} dB'}",
        ]
    )
