"""The codec's tables of docs/results.md (:mod:`.results_doc` renders them into their sections): the simulator's
ladders at phone scale, a per-step template's rungs against single mode, and held-out quality per level."""

from __future__ import annotations

from sakura_core.policy.plan import FLOOR_PSNR_DB

__all__ = ["heldout_table", "ladder_table", "per_step_model_table", "per_step_table"]


def ladder_table(*datas: dict) -> str:
    """The simulator's single-mode codec ladders (``docs/results/ladders/GEOMETRY.single.json``), one column per
    geometry: each level's size against fp16 (the mean over the shards) and its decode speed (fp16 MB/s, one thread
    on this host), with the level's PSNR; the floor marked."""
    from sakura_core.runtime.sim_ladders import ShardLadders

    lads = [ShardLadders.from_dict(d) for d in datas]
    fp16 = [
        4 * int(d["source"]["shard_size"][0] * d["source"]["shard_size"][1] * d["source"]["shard_size"][2])
        for d in datas
    ]
    rows = [
        "Command: `sakura bench e2e --mode sim --ladders docs/results/ladders` (with the e2e tables' other options) "
        "measures a geometry's ladder file when it is missing: delete one to measure it again. Files: "
        + ", ".join(f"`{d['_path']}`" for d in datas)
        + ".",
        "",
        "| level | PSNR dB | " + " | ".join(f"{lad.geometry}: x smaller, MB/s" for lad in lads) + " |",
        "|---" * (len(lads) + 2) + "|",
    ]
    first, seen = lads[0], set()
    for name, fam in first.families.items():
        for j, lv in enumerate(fam.levels):
            if lv in seen:  # fp16: sakura's top rung and a family of its own
                continue
            seen.add(lv)
            psnr = {round(lad.families[name].psnr_db()[j], 1) for lad in lads}
            cells = []
            for lad, fb in zip(lads, fp16, strict=True):
                f = lad.families[name]
                mean_bytes = sum(row[j] for row in f.bytes) / len(f.bytes)
                mean_s = sum(row[j] for row in f.decode_s) / len(f.decode_s)
                cells.append(f"{fb / mean_bytes:.2f}x, {fb / mean_s / 1e6:.0f}")
            mark = " (floor)" if j == fam.floor else ""
            p = "-".join(f"{v:.1f}" for v in sorted(psnr))
            rows.append(f"| {lv}{mark} | {p} | " + " | ".join(cells) + " |")
    src = datas[0]["source"]
    loads = [max(d["source"].get("load_average") or [float("nan")]) for d in datas]
    sizes = "; ".join(
        f"{lad.geometry} {' x '.join(str(x) for x in d['source']['shard_size'])}"
        for lad, d in zip(lads, datas, strict=True)
    )
    rows += [
        "",
        f"Measured on: {src['measured_on']}. Shard (one layer: tokens x heads x head_dim, K and V): {sizes}; "
        "the demo's layers synthesised to that size by token mixing. Decode: one thread on this "
        f"{src.get('cpu_count', '?')}-core {src.get('host_cpu', '')} host, 1-minute load average at most "
        f"{max(loads):.2f}.",
    ]
    return "\n".join(rows)


def _edit_ratio(ratios: list[float]) -> float:
    """Steps x fp16 / the bytes of every step (per-step ratios against one step's fp16)."""
    return len(ratios) / sum(1.0 / r for r in ratios)


def per_step_table(data: dict, geometry: str = "klein4b-512-ref1024") -> str:
    """``sakura_tools/bench/per_step_ladders.json`` (what the simulator's per-step sakura ladders are made of): per
    level, the open-loop chain and the closed-loop twins' track, each with its PSNR and its size against the edit's
    fp16 KV (every step), and what an edit of ``geometry`` fetches at it."""
    from sakura_core.runtime.geometry import get_geometry

    from .per_step_ladders import track_psnr_db

    g = get_geometry(geometry)
    steps, edit_fp16 = data["steps"], data["steps"] * g.kv_bytes_fp16
    floor_db = FLOOR_PSNR_DB  # the quality floor the policies keep
    levels = [lv for lv in data["levels"] if lv["name"] != "fp16"]
    open_floor = next((lv["name"] for lv in levels if lv["psnr_db"] >= floor_db), None)
    twin_floor = next((lv["name"] for lv in levels if lv.get("closed") and track_psnr_db(lv) >= floor_db), None)
    src = data.get("source", {})
    rows = [
        f"Command: `{src['command']}`" if src.get("command") else "Command: (not recorded)",
        "",
        f"| level | open loop: PSNR dB | x smaller than fp16 | GB per {geometry} edit | twins' track: PSNR dB | "
        "x smaller | GB per edit |",
        "|---" * 7 + "|",
    ]
    for lv in levels:
        o = _edit_ratio(lv["ratio_vs_fp16"])
        cells = [
            f"{lv['psnr_db']:.1f}" + (" (floor)" if lv["name"] == open_floor else ""),
            f"{o:.1f}x",
            f"{edit_fp16 / o / 1e9:.2f}",
        ]
        tw = lv.get("closed")
        if tw and tw.get("psnr_db") is not None:
            t = _edit_ratio([lv["ratio_vs_fp16"][0], *tw["ratio_vs_fp16"][1:]])
            cells += [
                f"{tw['psnr_db']:.1f}" + (" (floor)" if lv["name"] == twin_floor else ""),
                f"{t:.1f}x",
                f"{edit_fp16 / t / 1e9:.2f}",
            ]
        else:
            cells += ["-", "-", "-"]
        rows.append(f"| {lv['name']} | " + " | ".join(cells) + " |")
    reuse = data.get("reuse") or {}
    rows += [
        "",
        f"{steps} steps; fp16 of a {geometry} edit: {edit_fp16 / 1e9:.2f} GB (every step's template KV). "
        f"Open loop: step 0 the level's progressive chain, steps >= 1 residuals against the step before; twins' "
        f"track: step 0 at the level, steps >= 1 its closed-loop twins; GB per edit: the demo's ratios applied to the "
        f"geometry's fp16, as the simulator scales them. PSNR: {src.get('psnr', '?')}; "
        f"{src.get('template', '?')} template, {src.get('layers', '?')} layers of the trained demo model.",
    ]
    if reuse.get("psnr_db") is not None:
        rows.append(f"The zero-byte `reuse` rung (step s-1's KV for every step s >= 1): {reuse['psnr_db']:.1f} dB.")
    return "\n".join(rows)


def _heldout_command(data: dict) -> str:
    if data.get("command"):
        return data["command"]
    from .heldout import HeldOutConfig, heldout_command

    c = data["config"]
    cfg = HeldOutConfig(
        templates=tuple(c["templates"]),
        users=tuple(c["users"]),
        prompts=tuple(c["prompts"]),
        kv_mode=c["kv_mode"],
        steps=c["steps"],
        seed=c["seed"],
        floor_db=c["floor_db"],
    )
    return heldout_command(cfg, data["_path"])


def heldout_table(*datas: dict) -> str:
    """``sakura bench heldout`` per KV mode: per template the floor a client picks from the manifest, its bytes, the
    manifest's PSNR and the lowest on edits precompute never saw; per family how far held-out edits sit from the
    manifest; the floor's bytes in each mode side by side."""
    rows = ["Commands: " + "; ".join(f"`{_heldout_command(d)}`" for d in datas), ""]
    modes = [d["config"]["kv_mode"] for d in datas]
    rows += [
        "| template | "
        + " | ".join(f"{m}: floor, KB, manifest / held-out min dB" for m in modes)
        + (f" | {modes[1]} / {modes[0]} bytes |" if len(datas) == 2 else " |"),
        "|---" * (len(datas) + 1 + (len(datas) == 2)) + "|",
    ]
    templates = [f["template"] for f in datas[0]["floors"]]
    for t in templates:
        cells: list[str] = []
        nbytes: list[int | None] = []
        for d in datas:
            f = next((f for f in d["floors"] if f["template"] == t), None)
            if not f or f["floor"] is None:
                cells.append("no level reaches the floor")
                nbytes.append(None)
                continue
            cells.append(
                f"{f['floor']}, {f['bytes'] / 1e3:.1f}, {f['manifest_psnr_db']:.2f} / "
                f"{f['heldout_min_db']:.2f}" + ("" if f["holds"] else " (falls below)")
            )
            nbytes.append(f["bytes"])
        ratio = ""
        if len(datas) == 2:
            first, second = nbytes
            ratio = " | -" if first is None or second is None else f" | {second / first:.2f}x"
        rows.append(f"| {t} | " + " | ".join(cells) + ratio + " |")
    c = datas[0]["config"]
    edits = len(datas[0]["rows"][0]["heldout_psnr_db"]) if datas[0]["rows"] else 0
    rows += [
        "",
        f"Held-out edits: each template edited by the other sample images x {len(c['prompts'])} prompts "
        f"({edits} edits, seeds {c['seed']}-{c['seed'] + edits - 1}), {c['steps']} steps; floor: the cheapest "
        f"level whose manifest PSNR >= {c['floor_db']:g} dB. Manifest: {c['manifest_psnr']}.",
    ]
    for d in datas:
        held = sum(f["holds"] for f in d["floors"])
        fams = "; ".join(
            f"{fam} {v['median_diff_db']:+.2f} dB in the median, at worst {v['worst_shortfall_db']:.2f} dB below"
            if v["worst_shortfall_db"] > 0
            else f"{fam} {v['median_diff_db']:+.2f} dB in the median, never below"
            for fam, v in d["families"].items()
        )
        rows.append(
            f"{d['config']['kv_mode']}: the floor holds on every held-out edit for {held} of "
            f"{len(d['floors'])} templates; held-out - manifest PSNR, over every level and edit: {fams}."
        )
    return "\n".join(rows)


#: section name -> (JSON path(s) relative to the repository root, renderer of their contents in that order)


def per_step_model_table(data: dict) -> str:
    """``sakura bench ladder-model``: the counts the per-step ladder model is fitted on, its error per level on the
    held-out count (edit PSNR, bytes over the edit; open loop and the twins' track), and what it gives at 28 and 50
    steps (:mod:`.step_ladders`)."""
    from .step_ladders import model_data

    h = data["heldout"]
    rows = [
        f"Command: `{data['command']}`",
        "",
        f"Fitted on {', '.join(map(str, data['fit_on']))} steps; held out: {h['steps']} steps (the fit on "
        f"{', '.join(map(str, h['fit_on']))} steps against its measurement).",
        "",
        "| level | held out: PSNR error dB | bytes error | twins: PSNR error dB | twins: bytes error | "
        "28 steps: PSNR dB (twins) | 50 steps: PSNR dB (twins) |",
        "|---" * 7 + "|",
    ]
    at = {n: {lv["name"]: lv for lv in model_data(data, n)["levels"]} for n in (28, 50)}

    def psnr(lv):
        return f"{lv['psnr_db']:.1f}" + (f" ({lv['closed']['psnr_db']:.1f})" if lv.get("closed") else "")

    for r in h["levels"]:
        twin = (
            f"{r['closed_psnr_error_db']:+.2f} | {100 * r['closed_bytes_rel_error']:+.1f} %"
            if "closed_psnr_error_db" in r
            else "- | -"
        )
        rows.append(
            f"| {r['name']} | {r['psnr_error_db']:+.2f} | {100 * r['bytes_rel_error']:+.1f} % | {twin} | "
            f"{psnr(at[28][r['name']])} | {psnr(at[50][r['name']])} |"
        )
    rows += [
        "",
        f"Stated error on {h['steps']} steps: edit PSNR within {h['max_psnr_error_db']:.2f} dB, a level's bytes "
        f"over the edit within {100 * h['max_bytes_rel_error']:.1f} %. 28 and 50 steps extrapolate beyond every "
        "measured count; bytes error: the model's bytes over the edit / the measured - 1.",
    ]
    return "\n".join(rows)
