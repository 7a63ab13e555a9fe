"""``docs/results.md``'s measured results, generated from the benchmarks' committed JSON (``sakura bench results``):
each section between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` is rendered from the JSON file(s)
:data:`SECTIONS` names, with the command that made them, so the document cannot drift from what was run
(``--check`` fails when it has; ``tests/sakura_tools/bench/test_results_doc.py`` runs it)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

from .codec_tables import heldout_table, ladder_table, per_step_model_table, per_step_table
from .e2e_stream import load_e2e
from .e2e_tables import command_cell, e2e_oracle_table, e2e_targets_table, headline_table
from .store_profile_table import store_profile_table

__all__ = ["DOC", "DOCS", "SECTIONS", "planner_table", "regime_table", "render_section", "scale_table", "update_doc"]

DOC = "docs/results.md"  # relative to the repository root
DOCS = (DOC, "README.md")  # every document with generated sections: `sakura bench results` rewrites them all


def planner_table(data: dict, with_before: bool = True) -> str:
    """``sakura bench planner``: per case, ms per decision and planning per edit (and, ``with_before``, the rows of
    the earlier planner the JSON keeps under ``before``, labelled)."""
    parts = [("before", data.get("before")), ("after", data)] if with_before and data.get("before") else [("", data)]
    label = parts[0][0] != ""
    rows = [
        f"Command: {command_cell(data)}",
        "",
        ("| planner " if label else "") + "| steps x layers | decisions | ms / decision (mean / p99 / max) | "
        "planning s / edit | share of the edit |",
        "|---" * (5 + label) + "|",
    ]
    for name, part in parts:
        for r in (part or {}).get("rows", []):
            share = r["planning_share_of_latency"]
            rows.append(
                (f"| {name} " if label else "") + f"| {r['steps']} x {r['layers']} | {r['decisions']} | "
                f"{r['ms_per_decision_mean']:.2f} / {r['ms_per_decision_p99']:.2f} / "
                f"{r['ms_per_decision_max']:.2f} | {r['planning_s_per_edit']:.2f}"
                f"{'' if r['complete'] else ' (first decisions only)'} | "
                f"{'-' if share is None else f'{100 * share:.2f} %'} |"
            )
    trace = (data.get("rows") or [{}])[0].get("trace", "?")
    rows += [
        "",
        f"Per decision: the CPU time of the deciding thread on this {data.get('cpu', '?')} host, policy "
        f"{(data.get('rows') or [{}])[0].get('policy', '?')}, over a seeded synthetic link walk ({trace}); share: "
        "planning over the simulated edit's latency.",
    ]
    return "\n".join(rows)


def regime_table(data: dict) -> str:
    """``sakura bench regime``: per baseline, a table of device TFLOP/s x link Mbit/s, each cell the policy's speed-up
    and, in brackets, its ceiling (the fluid bound's); the cells reaching the target counted; the trace classes' rates
    when the run had them."""
    from .regime import cells_reaching

    pol, mb, own = data["policy"], data["mbit_per_s"], data["profile_tflop_per_s"]
    rows = [f"Command: {command_cell(data)}"]
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
            rows += [
                "",
                f">= {t:g}x vs {b}: {pol} in {len(cells_reaching(data, b, t))} of {n} cells, the ceiling in "
                f"{len(cells_reaching(data, b, t, 'ceiling'))}.",
            ]
    rows += [
        "",
        f"Cells: {data['geometry']}, {data['kv_mode']} KV, {data['profile']} scaled to each TFLOP/s, constant "
        f"links; the baseline's latency / {pol}'s, in brackets / the fluid lower bound's (the ceiling: no policy "
        f"passes it with these bytes); planning charged: {data.get('planning', 'none')}.",
    ]
    if data.get("trace_classes"):
        rows.append(
            "Trace classes (median over the class's traces of each trace's mean rate): "
            + "; ".join(f"{c} {r['median_mean_mbit_s']:.1f} Mbit/s" for c, r in data["trace_classes"].items())
            + "."
        )
    return "\n".join(rows)


def scale_table(data: dict) -> str:
    """``sakura bench scale``: per step count, the CPU seconds of one per-step edit simulated with every policy, with
    sakura, with the oracle and of the fluid bound, and the peak RSS; the ``before`` rows in brackets."""
    old = {r["steps"]: r for r in data.get("before") or []}
    rows = [
        f"Command: {command_cell(data)}",
        "",
        "| steps x layers | every policy, CPU s | sakura s | oracle s | fluid bound s | peak RSS MiB |",
        "|---" * 6 + "|",
    ]
    for r in data["rows"]:
        b = old.get(r["steps"])

        def cell(get, digits=2, r=r, b=b):
            return f"{get(r):.{digits}f}" + ("" if b is None else f" ({get(b):.{digits}f})")

        rows.append(
            f"| {r['steps']} x {r['layers']} | {cell(lambda x: x['cpu_s_total'])} | "
            f"{cell(lambda x: x['cpu_s']['sakura'])} | {cell(lambda x: x['cpu_s']['oracle'])} | "
            f"{cell(lambda x: x['cpu_s']['fluid-bound'])} | "
            f"{cell(lambda x: x['peak_rss_bytes'] / 2**20, 0)} |"
        )
    rows += [
        "",
        f"Policies: {', '.join(data['policies'])}; CPU seconds of one process on this {data.get('cpu', '?')} "
        "host (time.process_time), "
        + (
            "the stated synthetic ladders of bench/scale.py"
            if data.get("ladders", "synthetic") == "synthetic"
            else f"the committed per-step ladders of {data['ladders']} stretched to each step count and sakura's "
            "per-step ladders measured or modelled for it (bench/step_ladders.py)"
        )
        + " on a seeded random-walk link"
        + ("; in brackets: the same command before the change (`before` in the JSON)." if old else "."),
    ]
    return "\n".join(rows)


# section name -> (its JSON file, or files, under the repository root; the table it renders: JSON data -> Markdown)
SECTIONS: dict[str, tuple[str | tuple[str, ...], Callable[..., str]]] = {
    "headline": ("docs/results/e2e_sim.json", headline_table),
    "ladders": (
        tuple(
            f"docs/results/ladders/{g}.single.json"
            for g in ("phone-dit-512", "klein4b-512-ref1024", "klein4b-512-2ref1024")
        ),
        ladder_table,
    ),
    "per-step": ("sakura_tools/bench/per_step_ladders.json", per_step_table),
    "heldout": (("docs/results/heldout_single.json", "docs/results/heldout_per_step.json"), heldout_table),
    "per-step-model": ("sakura_tools/bench/per_step_model.json", per_step_model_table),
    "e2e-targets": ("docs/results/e2e_sim.json", e2e_targets_table),
    "e2e-oracle": ("docs/results/e2e_sim.json", e2e_oracle_table),
    "e2e-steps": ("docs/results/e2e_steps.jsonl", functools.partial(e2e_targets_table, classes=("3G", "4G"))),
    "e2e-steps-oracle": ("docs/results/e2e_steps.jsonl", e2e_oracle_table),
    "e2e-prefetch-1gib": ("docs/results/prefetch/e2e_prefetch_1gib.json", e2e_targets_table),
    "e2e-prefetch-0gib": ("docs/results/prefetch/e2e_prefetch_0gib.json", e2e_targets_table),
    "regime": ("docs/results/regime_paper.json", regime_table),
    "planner": ("docs/results/planner.json", functools.partial(planner_table, with_before=False)),
    "e2e-ci": ("docs/results/ci/e2e_ci.json", e2e_oracle_table),
    "scale": ("docs/results/scale.json", scale_table),
    "scale-ladders": ("docs/results/scale_ladders.json", scale_table),
    "store-profile": (
        tuple(
            f"docs/results/store_profile/paper_{p}.json"
            for p in ("1ms_full", "1ms_serving", "measured_full", "measured_serving")
        ),
        store_profile_table,
    ),
}


def section_paths(name: str) -> tuple[str, ...]:
    paths = SECTIONS[name][0]
    return (paths,) if isinstance(paths, str) else paths


def render_section(name: str, root: Path) -> str:
    """The section's body, rendered from its JSON file(s) under ``root`` (each given its path as ``_path``; a
    ``.jsonl`` e2e run read back whole, its runs left out: :func:`~sakura_tools.bench.e2e_stream.load_e2e`)."""
    fn = SECTIONS[name][1]
    return fn(*({**load_e2e(root / p, with_runs=False), "_path": p} for p in section_paths(name)))


def update_doc(doc: Path, root: Path, check: bool = False) -> list[str]:
    """Render every section ``doc`` marks; write it back (or, with ``check``, only compare). Returns the names of the
    sections that differ (``check``) or were rewritten."""
    text = doc.read_text()
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
        doc.write_text(text)
    return changed
