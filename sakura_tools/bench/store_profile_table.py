"""``docs/results.md``'s store-profile rows: which store profile an e2e JSON ran with (:func:`profile_note`), and the
paper regime with sakura's template in the ``serving`` profile against the ``full`` one (:func:`store_profile_table`,
``sakura bench e2e --mode sim --store-profile serving|full``)."""

from __future__ import annotations

__all__ = ["PROFILE_TOLERANCE", "profile_note", "store_profile_table"]

#: The issue's bound: the serving profile's speed-ups within 2 % of the full store's.
PROFILE_TOLERANCE = 0.02
_CLASSES = ("4G", "5G")
_VS = ("on-device", "cachegen")


def _first(data: dict) -> dict:
    return data["results"][0] if "results" in data else data


def profile_note(data: dict) -> str:
    """One sentence: the store profile sakura's template was simulated in (a JSON made before ``--store-profile``
    existed: ``full``, every rung and the fp16 held)."""
    r = _first(data)
    profile = r.get("store_profile")
    if profile is None:
        return (
            "Store profile: full (the run predates `--store-profile`: every rung and the fp16 held; "
            "`--store-profile full` reproduces it)."
        )
    held = next((line for line in r.get("header", []) if line.startswith("store profile")), f"store profile {profile}")
    fp16 = " The fetch-fp16 baseline reads a full store's fp16." if profile == "serving" else ""
    return f"Store profile: {held.removeprefix('store profile ')}.{fp16}"


def _cells(r: dict) -> list[float]:
    return [r["by_class"][c]["headline"]["speedup_median"][p] for c in _CLASSES for p in _VS]


def store_profile_table(*runs: dict) -> str:
    """Pairs of e2e JSON (full, serving) of the paper regime, one pair per planning charge: speed-ups vs on-device
    and CacheGen (median, 4G and 5G), sakura's median PSNR and each serving figure's change against its full run."""
    if len(runs) % 2:
        raise ValueError("store_profile_table takes (full, serving) pairs of e2e JSON")
    cmds = [f"`{d['command']}`" for d in runs]
    rows = [
        "Commands: " + ", ".join(cmds),
        "",
        "| planning | store profile | "
        + " | ".join(f"{c} vs {p}" for c in _CLASSES for p in _VS)
        + " | PSNR dB (4G / 5G) | largest change vs full |",
        "|---" * (4 + len(_CLASSES) * len(_VS)) + "|",
    ]
    worst, low = (
        0.0,
        min(_first(d)["by_class"][c]["headline"]["sakura_psnr_db_median"] for d in runs for c in _CLASSES),
    )
    for full, serving in zip(runs[::2], runs[1::2], strict=True):
        base = _cells(_first(full))
        for d in (full, serving):
            r = _first(d)
            s = r.get("settings", {})
            plan = "measured" if s.get("planning") == "measured" else f"{1e3 * s.get('planning_s', 0):g} ms"
            vals = _cells(r)
            change = max(abs(v / b - 1) for v, b in zip(vals, base, strict=True))
            worst = max(worst, change)
            psnr = " / ".join(f"{r['by_class'][c]['headline']['sakura_psnr_db_median']:.1f}" for c in _CLASSES)
            rows.append(
                f"| {plan} | {r.get('store_profile', 'full')} | "
                + " | ".join(f"{v:.3f}x" for v in vals)
                + f" | {psnr} | {'-' if d is full else f'{100 * change:.3f} %'} |"
            )
    ok = worst <= PROFILE_TOLERANCE and low >= 35.0
    rows += [
        "",
        f"Per-step KV, klein4b-512-ref1024, snapdragon-8-elite-cpu, simulated on the 4G and 5G traces x 3 "
        f"starts. Target (speed-ups within {100 * PROFILE_TOLERANCE:g} % of the full store's, PSNR >= 35 dB): "
        f"{'met' if ok else 'not met'} (largest change {100 * worst:.3f} %, lowest median PSNR {low:.1f} dB). "
        "The fetch-fp16 baseline needs a full store: a serving store holds no fp16.",
    ]
    return "\n".join(rows)
