"""The end-to-end benchmark's tables of docs/results.md (:mod:`.results_doc` renders them into their sections): the
paper regime's headline against its targets, sakura's speed-ups with their ceilings and sakura / oracle per trace
class, each read from the JSON ``sakura bench e2e`` wrote, with the command that made it."""

from __future__ import annotations

from .store_profile_table import profile_note

__all__ = [
    "CLASSES",
    "HEADLINE_TARGETS",
    "PAPER",
    "command_cell",
    "e2e_oracle_table",
    "e2e_targets_table",
    "headline_table",
]

CLASSES = ("3G", "4G", "broadband", "5G")
_SHORT = {"snapdragon-8-elite-cpu": "cpu", "snapdragon-8-elite-gpu": "gpu", "snapdragon-8-elite-npu": "npu"}


def _results(data: dict) -> list[dict]:
    return data["results"] if "results" in data else [data]


def _pair(s: dict | None, digits: int = 2) -> str:
    return "-" if not s else f"{s['median']:.{digits}f} / {s['worst']:.{digits}f}"


def _label(r: dict) -> str:
    """KV mode, geometry (with its step count where the run changed it: ``--edit-steps``), profile."""
    from sakura_core.runtime.profiles import GEOMETRIES

    geo = GEOMETRIES.get(r["geometry"])
    steps = r.get("steps")
    more = f" x {steps} steps" if steps is not None and geo is not None and steps != geo.steps else ""
    return f"{r['kv_mode']}, {r['geometry']}{more}, {_SHORT.get(r['profile'], r['profile'])}"


def command_cell(data: dict) -> str:
    """The command that made ``data``, as Markdown code (or a note that it was not recorded)."""
    return f"`{data['command']}`" if data.get("command") else "(command not recorded)"


def _option(data: dict, flag: str) -> str | None:
    argv = data.get("argv") or []
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def _runs_line(data: dict) -> str:
    """Which traces, how many runs, what planning cost: what a reader needs to weigh an e2e table."""
    r = _results(data)[0]
    per = [f"{c} {r['by_class'][c]['traces']}" for c in CLASSES if c in r["by_class"]]
    total = r["by_class"].get("all", {}).get("traces", "?")
    s = r.get("settings", {})
    planning = {
        "measured": "each decision's CPU time measured on this host",
        "fixed": f"a fixed {1e3 * s.get('planning_s', 0):g} ms per decision",
    }.get(s.get("planning"), "none")
    line = (
        f"Runs: {total} traces of `{_option(data, '--traces') or '?'}` ({', '.join(per)}) x {s.get('starts', '?')} "
        f"start offsets each, every policy; planning charged: {planning}; requests: "
        f"{_option(data, '--requests') or 'ahead'}"
    )
    gib = _option(data, "--prefetch-gib")
    line += f"; prefetch bounded to {float(gib):g} GiB of decoded KV." if gib else "; prefetch not bounded."
    return f"{line} {profile_note(data)}"


def e2e_oracle_table(data: dict) -> str:
    """sakura / oracle per class (median / worst over every trace x start) and the worst vs fetching nothing."""
    rows = [
        f"Command: {command_cell(data)}",
        "",
        _runs_line(data),
        "",
        "| KV mode, geometry, profile | " + " | ".join(CLASSES) + " | max vs fetch-nothing |",
        "|---" * (len(CLASSES) + 2) + "|",
    ]
    medians, worsts, guard = [], [], []
    for r in _results(data):
        cells = []
        for cls in CLASSES:
            part = r["by_class"].get(cls)
            v = part["headline"]["sakura_vs_oracle"] if part else None
            cells.append(_pair(v))
            if v:
                medians.append(v["median"])
                worsts.append(v["worst"])
        worst = r["by_class"]["all"]["headline"]["sakura_vs_fetch_nothing"]
        last = "-" if not worst else f"{worst['worst']:.3f}"
        guard += [worst["worst"]] if worst else []
        rows.append(f"| {_label(r)} | " + " | ".join(cells) + f" | {last} |")
    starts = min(r["settings"]["starts"] for r in _results(data))
    rows += [
        "",
        f"Cells: sakura / oracle latency, median / worst over every trace of the class x {starts} start "
        "offsets; last column: the worst sakura / best fetch-nothing policy over every run.",
    ]
    if medians:
        n = len(medians)
        rows.append(
            f"Medians {min(medians):.2f}-{max(medians):.2f} (<= 1.10 in {sum(m <= 1.10 for m in medians)} "
            f"of {n} cells); worst runs up to {max(worsts):.2f} (<= 1.30 in {sum(w <= 1.30 for w in worsts)} "
            f"of {n}); worst vs fetch-nothing {max(guard):.3f} (<= 1.02 in {sum(g <= 1.02 for g in guard)} "
            f"of {len(guard)} rows)."
        )
    return "\n".join(rows)


def e2e_targets_table(data: dict, classes=("4G", "5G")) -> str:
    """Per KV mode / geometry / profile and class: sakura's speed-ups (each with its ceiling: the fluid lower bound's
    speed-up over the same baseline, which no policy passes with these bytes), PSNR, the bound and the decoded KV
    sakura holds at once."""
    old = any(
        NO_FLOOR in part["headline"]["speedup_median"] for r in _results(data) for part in r["by_class"].values()
    )
    head = (
        "| KV mode, geometry, profile | class | vs on-device | vs cachegen | "
        + ("vs cachegen (no floor) | " if old else "")
        + "vs fetch-fp16 | PSNR dB | "
        "sakura / fluid bound | oracle / fluid bound | fluid bound s | KV held GB |"
    )
    rows = [f"Command: {command_cell(data)}", "", _runs_line(data), "", head, "|---" * (10 + old) + "|"]
    near = []
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
            held = part.get("summary", {}).get("sakura", {}).get("median_peak_kv_bytes")
            near += [h["sakura_vs_fluid"]["median"]] if h.get("sakura_vs_fluid") else []
            rows.append(
                f"| {_label(r)} | {cls} | {x('on-device')} | {x('cachegen')} | "
                + (f"{x(NO_FLOOR)} | " if old else "")
                + f"{x('fetch-fp16')} | "
                f"{h['sakura_psnr_db_median']:.1f} | {_pair(h['sakura_vs_fluid'])} | "
                f"{_pair(h['oracle_vs_fluid'])} | {'-' if bound is None else f'{bound:.0f}'} | "
                f"{'-' if held is None else f'{held / 1e9:.2f}'} |"
            )
    rows += [
        "",
        "Speed-ups: the median over every run of the policy's latency / sakura's; in brackets the ceiling, the "
        "same median for the fluid lower bound in sakura's place (no policy passes it with these bytes); bounds: "
        "median / worst; KV held: the decoded template KV sakura holds at once, median run."
        + (f" {NO_FLOOR_NOTE}" if old else ""),
    ]
    if near:
        rows.append(
            f"sakura within 1.10x of the fluid bound (median): {sum(v <= 1.10 for v in near)} of {len(near)} cells."
        )
    return "\n".join(rows)


#: The paper regime: the per-step klein edit on the phone CPU, on the 4G and 5G traces; the targets each comparison
#: is held to (speed-ups: at least; latency over the fluid bound: at most).
PAPER = ("per-step", "klein4b-512-ref1024", "snapdragon-8-elite-cpu")
TWO_REFERENCES = ("per-step", "klein4b-512-2ref1024", "snapdragon-8-elite-cpu")
#: CacheGen as measured, not held to the 35 dB floor (its best level the floor): the old rule, reported once beside it.
NO_FLOOR = "cachegen-no-floor"
NO_FLOOR_NOTE = (
    "CacheGen is held to sakura's 35 dB floor: where none of its levels reaches it (per-step KV: its best "
    "gives 29.2 dB) it fetches fp16 or recomputes, as its rule says; cachegen (no floor): the old rule, "
    "its best level under the floor allowed, reported once beside it."
)
HEADLINE_TARGETS = {
    "on-device": 3.0,
    "cachegen": 1.5,
    "fetch-fp16": 3.0,
    "psnr": 35.0,
    "fluid": 1.10,
    "two-references": 4.0,
}


def _find(data: dict, key: tuple[str, str, str]) -> dict | None:
    return next((r for r in _results(data) if (r["kv_mode"], r["geometry"], r["profile"]) == key), None)


def headline_table(data: dict, classes=("4G", "5G")) -> str:
    """The paper regime in one table: sakura against computing the template on the phone, CacheGen and fetching fp16
    (median speed-up, the ceiling in brackets), its PSNR and its latency over the fluid bound, each against its
    target; a missed target says whether any policy could meet it with these bytes (the ceiling)."""
    paper, two = _find(data, PAPER), _find(data, TWO_REFERENCES)
    if paper is None:
        raise ValueError(f"no {', '.join(PAPER)} result in the e2e JSON")
    t = HEADLINE_TARGETS

    def speedup(r, policy, target):
        cells, missed = [], []
        for cls in classes:
            h = r["by_class"][cls]["headline"]
            v, top = h["speedup_median"][policy], h["speedup_ceiling_median"][policy]
            cells.append(f"{v:.2f}x ({top:.2f}x)")
            if v < target:
                why = f"out of reach, ceiling {top:.2f}x" if top < target else f"ceiling {top:.2f}x"
                missed.append(f"{cls}: {why}")
        return cells, "met" if not missed else "not met (" + "; ".join(missed) + ")"

    def plain(r, get, fmt, ok):
        vals = [get(r["by_class"][cls]["headline"]) for cls in classes]
        bad = [cls for cls, v in zip(classes, vals, strict=True) if not ok(v)]
        return [fmt(v) for v in vals], "met" if not bad else f"not met ({', '.join(bad)})"

    rows = [
        f"Command: {command_cell(data)}",
        "",
        f"Paper regime: {PAPER[0]} KV, {PAPER[1]}, {PAPER[2]} (simulated; {', '.join(classes)} traces). "
        + profile_note(data),
        "",
        "| sakura vs | target | " + " | ".join(classes) + " | |",
        "|---" * (len(classes) + 3) + "|",
    ]
    for label, policy in (
        ("on-device: the phone computes the template", "on-device"),
        ("CacheGen held to 35 dB: its codec's bytes, else fp16 or recompute", "cachegen"),
        ("fetch-fp16: the template KV uncompressed", "fetch-fp16"),
    ):
        cells, status = speedup(paper, policy, t[policy])
        rows.append(f"| {label} | >= {t[policy]:.1f}x | " + " | ".join(cells) + f" | {status} |")
    cells, status = plain(
        paper, lambda h: h["sakura_psnr_db_median"], lambda v: f"{v:.1f} dB", lambda v: v >= t["psnr"]
    )
    rows.append(f"| output PSNR vs exact KV (median) | >= {t['psnr']:g} dB | " + " | ".join(cells) + f" | {status} |")
    cells, status = plain(
        paper, lambda h: h["sakura_vs_fluid"]["median"], lambda v: f"{v:.2f}", lambda v: v <= t["fluid"]
    )
    rows.append(
        f"| latency / fluid lower bound (median) | <= {t['fluid']:.2f} | " + " | ".join(cells) + f" | {status} |"
    )
    if two is not None:
        cells, status = speedup(two, "on-device", t["two-references"])
        rows.append(
            f"| on-device, two 1024² references ({TWO_REFERENCES[1]}) | >= {t['two-references']:.1f}x | "
            + " | ".join(cells)
            + f" | {status} |"
        )
    old = all(NO_FLOOR in paper["by_class"][cls]["headline"]["speedup_median"] for cls in classes)
    if old:
        cells = [_speedup_cell(paper["by_class"][cls]["headline"], NO_FLOOR) for cls in classes]
        rows.insert(
            rows.index(next(r for r in rows if r.startswith("| CacheGen"))) + 1,
            "| cachegen (no floor): the old rule, its best level under 35 dB allowed | - | "
            + " | ".join(cells)
            + " | reported once, beside the held rule |",
        )
    psnr = "; ".join(
        f"{label} {' / '.join(_psnr(paper, p, cls) for cls in classes)} dB"
        for label, p in (("CacheGen", "cachegen"), ("cachegen (no floor)", NO_FLOOR))
        if p != NO_FLOOR or old
    )
    rows += [
        "",
        "Speed-ups: the median over every run (trace x start offset) of the baseline's latency / sakura's; in "
        "brackets the ceiling: the same median with the fluid lower bound in sakura's place, which no policy "
        f"passes with these bytes. Median PSNR in these runs: {psnr}." + (f" {NO_FLOOR_NOTE}" if old else ""),
    ]
    return "\n".join(rows)


def _speedup_cell(h: dict, policy: str) -> str:
    return f"{h['speedup_median'][policy]:.2f}x ({h['speedup_ceiling_median'][policy]:.2f}x)"


def _psnr(r: dict, policy: str, cls: str) -> str:
    return f"{r['by_class'][cls]['summary'][policy]['median_psnr_db']:.1f}"  # 100.0: exact (computed on the device)
