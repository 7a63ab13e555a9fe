"""What ``sakura bench e2e`` (sim and live) prints and runs: the policy selection and the results table."""

from __future__ import annotations

from sakura_core.policy.policies import POLICIES

__all__ = ["format_table", "select_policies"]


def select_policies(arg: str, mode: str) -> list[str]:
    """``--policies`` (a comma list or "all") -> policy names; sakura is always run (ratios are against it)."""
    names = list(POLICIES) if arg == "all" else [p.strip() for p in arg.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad:
        raise SystemExit(f"sakura bench e2e: unknown policies {bad}; choose from {', '.join(POLICIES)} or 'all'")
    if mode == "live":
        names = [p for p in names if not POLICIES[p].simulation_only]  # a bound or a sim-only variant
    if "sakura" not in names:
        names.append("sakura")
    return names


def format_table(summary: dict, ratios: dict) -> str:
    """The printed e2e table: per policy, median / p90 latency, median PSNR, latency ratios vs sakura and the median
    peak of the decoded template KV held (GiB)."""
    head = (
        f"{'policy':<18}{'median s':>10}{'p90 s':>10}{'PSNR dB':>9}{'x sakura (med)':>16}{'min':>9}{'max':>9}"
        f"{'KV GiB':>8}"
    )
    lines = [head, "-" * len(head)]
    for name, s in summary.items():
        r = ratios.get(name, {})
        lines.append(
            f"{name:<18}{s['median_latency_s']:>10.2f}{s['p90_latency_s']:>10.2f}{s['median_psnr_db']:>9.1f}"
            f"{r.get('median_ratio_vs_sakura', float('nan')):>16.2f}{r.get('min_ratio_vs_sakura', float('nan')):>9.2f}"
            f"{r.get('max_ratio_vs_sakura', float('nan')):>9.2f}{s.get('median_peak_kv_bytes', 0) / 2**30:>8.2f}"
        )
    return "\n".join(lines)
