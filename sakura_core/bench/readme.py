"""The README's measured results, generated from the benchmarks' JSON (``sakura bench readme``): each section between
``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` is rendered from one JSON file, with the command that made
it, so the document cannot drift from what was run (``--check`` fails when it has; ``tests/test_readme_results.py``
runs it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["SECTIONS", "regime_table", "render_section", "update_readme"]

CLASSES = ("3G", "4G", "broadband", "5G")
_SHORT = {"snapdragon-8-elite-cpu": "cpu", "snapdragon-8-elite-gpu": "gpu", "snapdragon-8-elite-npu": "npu"}


def _results(data: dict) -> list[dict]:
    return data["results"] if "results" in data else [data]


def _pair(s: dict | None, digits: int = 2) -> str:
    return "-" if not s else f"{s['median']:.{digits}f} / {s['worst']:.{digits}f}"


def _label(r: dict) -> str:
    return f"{r['kv_mode']}, {r['geometry']}, {_SHORT.get(r['profile'], r['profile'])}"


def _command(data: dict) -> str:
    return f"`{data['command']}`" if data.get("command") else "(command not recorded)"


def e2e_oracle_table(data: dict) -> str:
    """sakura / oracle per class (median / worst over every trace x start) and the worst vs fetching nothing."""
    rows = [f"Command: {_command(data)}", "",
            "| KV mode, geometry, profile | " + " | ".join(CLASSES) + " | max vs fetch-nothing |",
            "|---" * (len(CLASSES) + 2) + "|"]  # fmt: skip
    for r in _results(data):
        cells = []
        for cls in CLASSES:
            part = r["by_class"].get(cls)
            cells.append(_pair(part["headline"]["sakura_vs_oracle"]) if part else "-")
        worst = r["by_class"]["all"]["headline"]["sakura_vs_fetch_nothing"]
        last = "-" if not worst else f"{worst['worst']:.3f}"
        rows.append(f"| {_label(r)} | " + " | ".join(cells) + f" | {last} |")
    starts = min(r["settings"]["starts"] for r in _results(data))
    rows += ["", f"Cells: sakura / oracle latency, median / worst over every trace of the class x {starts} start "
                 "offsets; last column: the worst sakura / best fetch-nothing policy over every run."]  # fmt: skip
    return "\n".join(rows)


def e2e_targets_table(data: dict, classes=("4G", "5G")) -> str:
    """Per KV mode / geometry / profile and class: sakura's speed-ups (each with its ceiling: the fluid lower bound's
    speed-up over the same baseline, which no policy passes with these bytes), PSNR and the bound."""
    head = ("| KV mode, geometry, profile | class | vs on-device | vs cachegen | vs fetch-fp16 | PSNR dB | "
            "sakura / fluid bound | oracle / fluid bound | fluid bound s |")  # fmt: skip
    rows = [f"Command: {_command(data)}", "", head, "|---" * 9 + "|"]
    for r in _results(data):
        for cls in classes:
            part = r["by_class"].get(cls)
            if not part:
                continue
            h = part["headline"]
            sp, top = h["speedup_median"], h.get("speedup_ceiling_median", {})

            def x(p, sp=sp, top=top):
                return "-" if p not in sp else f"{sp[p]:.2f}x" + (f" ({top[p]:.2f}x)" if p in top else "")

            bound = h["fluid_bound_median_s"]
            rows.append(f"| {_label(r)} | {cls} | {x('on-device')} | {x('cachegen')} | {x('fetch-fp16')} | "
                        f"{h['sakura_psnr_db_median']:.1f} | {_pair(h['sakura_vs_fluid'])} | "
                        f"{_pair(h['oracle_vs_fluid'])} | {'-' if bound is None else f'{bound:.0f}'} |")  # fmt: skip
    rows += ["", "Speed-ups: the median over every run of the policy's latency / sakura's; in brackets the ceiling, the "
             "same median for the fluid lower bound in sakura's place (no policy passes it with these bytes); bounds: "
             "median / worst."]  # fmt: skip
    return "\n".join(rows)


def planner_table(data: dict) -> str:
    """``sakura bench planner``: per case, ms per decision and planning per edit (and the before rows if any)."""
    rows = [f"Command: {_command(data)}", "",
            "| planner | steps x layers | decisions | ms / decision (mean / p99 / max) | planning s / edit | share |",
            "|---" * 6 + "|"]  # fmt: skip
    for label, part in (("before", data.get("before")), ("after", data)):
        for r in (part or {}).get("rows", []):
            share = r["planning_share_of_latency"]
            rows.append(f"| {label} | {r['steps']} x {r['layers']} | {r['decisions']} | "
                        f"{r['ms_per_decision_mean']:.2f} / {r['ms_per_decision_p99']:.2f} / "
                        f"{r['ms_per_decision_max']:.2f} | {r['planning_s_per_edit']:.2f}"
                        f"{'' if r['complete'] else ' (first decisions only)'} | "
                        f"{'-' if share is None else f'{100 * share:.2f} %'} |")  # fmt: skip
    return "\n".join(rows)


def regime_table(data: dict) -> str:
    """``sakura bench regime``: per baseline, a table of device TFLOP/s x link Mbit/s, each cell the policy's speed-up
    and, in brackets, its ceiling (the fluid bound's); the cells reaching the target counted; the trace classes' rates
    when the run had them."""
    from .regime import cells_reaching

    pol, mb, own = data["policy"], data["mbit_per_s"], data["profile_tflop_per_s"]
    rows = [f"Command: {_command(data)}"]
    for b in data["baselines"]:
        rows += [
            "",
            f"| {pol} vs {b} | " + " | ".join(f"{m:g} Mbit/s" for m in mb) + " |",
            "|---" * (len(mb) + 1) + "|",
        ]
        for tf, row in zip(data["tflop_per_s"], data["cells"], strict=True):
            mark = " (the profile's)" if abs(tf - own) <= 1e-9 * max(own, 1.0) else ""
            cells = " | ".join(f"{c['speedup'][b]:.2f}x ({c['ceiling'][b]:.2f})" for c in row)
            rows.append(f"| {tf:g} TFLOP/s{mark} | {cells} |")
        if data.get("target") is not None:
            t, n = data["target"], len(data["tflop_per_s"]) * len(mb)
            rows += ["", f">= {t:g}x vs {b}: {pol} in {len(cells_reaching(data, b, t))} of {n} cells, the ceiling in "
                     f"{len(cells_reaching(data, b, t, 'ceiling'))}."]  # fmt: skip
    rows += ["", f"Cells: {data['geometry']}, {data['kv_mode']} KV, {data['profile']} scaled to each TFLOP/s, constant "
             f"links; the baseline's latency / {pol}'s, in brackets / the fluid lower bound's (the ceiling: no policy "
             f"passes it with these bytes); planning charged: {data.get('planning', 'none')}."]  # fmt: skip
    if data.get("trace_classes"):
        rows.append("Trace classes (median over the class's traces of each trace's mean rate): " + "; ".join(
            f"{c} {r['median_mean_mbit_s']:.1f} Mbit/s" for c, r in data["trace_classes"].items()) + ".")  # fmt: skip
    return "\n".join(rows)


SECTIONS = {  # section name -> (JSON path relative to the repository root, renderer)
    "e2e-oracle": ("docs/results/e2e_sim.json", e2e_oracle_table),
    "e2e-targets": ("docs/results/e2e_sim.json", e2e_targets_table),
    "planner": ("docs/results/planner.json", planner_table),
    "e2e-ci": ("docs/results/ci/e2e_ci.json", e2e_oracle_table),
    "regime": ("docs/results/regime_paper.json", regime_table),
    "e2e-prefetch-1gib": ("docs/results/prefetch/e2e_prefetch_1gib.json", e2e_targets_table),
    "e2e-prefetch-0gib": ("docs/results/prefetch/e2e_prefetch_0gib.json", e2e_targets_table),
}


def render_section(name: str, root: Path) -> str:
    path, fn = SECTIONS[name]
    return fn(json.loads((root / path).read_text()))


def update_readme(readme: Path, root: Path, check: bool = False) -> list[str]:
    """Render every section the README marks; write it back (or, with ``check``, only compare). Returns the names of
    the sections that differ (``check``) or were rewritten."""
    text = readme.read_text()
    changed = []
    for name in SECTIONS:
        pat = re.compile(rf"(<!-- results:{re.escape(name)} -->\n)(.*?)(<!-- /results:{re.escape(name)} -->)", re.S)
        m = pat.search(text)
        if m is None:
            continue
        body = render_section(name, root) + "\n"
        if m.group(2) != body:
            changed.append(name)
            text = text[: m.start(2)] + body + text[m.end(2) :]
    if changed and not check:
        readme.write_text(text)
    return changed
