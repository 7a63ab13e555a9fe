"""``sakura bench e2e --mode page``: the phone page itself, live. The web model (``sakura export --target web``) and
the per-step demo template (the sakura codec, every rung and the exact fp16 kept) are served by a ``sakura serve
--phone-model`` subprocess on 127.0.0.1; headless Chromium runs each policy's edit on the page (its lanes, its policy,
onnxruntime-web) with the link shaped from each trace through CDP and the CPU throttled (:mod:`.page_driver`),
``--page-repeats`` rounds of every trace and policy (interleaved; the median edit of each is compared).

Per trace and policy: the page's latency (its report's total), bytes, and the busy-time bound (the serial work
before the lanes, measured: the manifest's wait and the template image, then the largest of the lanes' busy seconds,
``report.busy_s``: fetch, decode, compute less its stalls). Then the same trace is replayed in the simulator with the
page's measured profile (:func:`page_profile`: a DiT step's and a template-pass layer's seconds alone, and the CPU
the page's decodes take from its DiT) and the served ladders, the requests as the page's fetch lane sent them (its
report's ``request_ahead``: ahead of the wire by default, as Python's lanes), the template image on the trace first
where the page fetches it first (seeding the estimator, as the page's does), plus each run's measured manifest wait;
the simulator's oracle on sakura's ladders beside them (the ceiling: on-device over the oracle is the most any policy
gains on that link and device). The live and simulated speed-ups of sakura over on-device and fetch-fp16 are printed
side by side and written as JSON, each compared run with the page's report (timeline, decisions).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from sakura_core.files import atomic_write_json
from sakura_core.policy.plan import plan_fetch
from sakura_core.runtime.live_profile import LiveProfile

from .requests_flag import requests_ahead

__all__ = ["contention_cores", "decode_slowdown", "page_profile", "run_page"]

PAGE_POLICIES = ("on-device", "fetch-fp16", "sakura")
PAGE_TRACES = ("walk110-1.5-0.3", "walk113-6-0.4", "onoff103-10-0.5")  # slow walk, faster walk, on/off with outages
TEMPLATE_ID = "page-bench"
PROMPT = "place it"
# the policies whose page edit fetches the template image before its lanes (the template pass needs it; page_edit.js)
IMAGE_FIRST = ("on-device", "sakura", "oracle")


def _publish(root: Path, steps: int) -> tuple[Path, Path]:
    """The web model and the per-step demo template (sakura codec, store profile full) under ``root``."""
    import torch

    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.cli import main
    from sakura_core.models.edit_model import load_demo_model, load_image

    if main(["export", "--target", "web", "--out", str(root / "model")]) != 0:
        raise SystemExit("sakura bench e2e --mode page: sakura export --target web failed (see above)")
    torch.set_num_threads(1)
    model = load_demo_model()
    image = load_image("astronaut", model.spec.image_size)
    publish_template(
        LocalStore(root / "store"),
        model,
        image,
        TEMPLATE_ID,
        kv_mode="per-step",
        steps=steps,
        codec="sakura",
        store_profile="full",
    )
    from PIL import Image

    Image.fromarray(load_image("chelsea", model.spec.image_size)).save(root / "photo.png")
    return root / "store", root / "model"


def _intervals(report: dict, lane: str) -> list[tuple[float, float]]:
    return [(e["start"], e["end"]) for e in report["timeline"] if e["lane"] == lane]


def _overlap_s(t0: float, t1: float, intervals: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(t1, b1) - max(t0, b0)) for b0, b1 in intervals)


def _compute_events(reports: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """(seconds, seconds overlapped by the decode lane) of every compute event, by kind: "step" (a DiT step) and
    "pass" (a template-pass layer)."""
    out: dict[str, list[tuple[float, float]]] = {"step": [], "pass": []}
    for r in reports:
        decode = _intervals(r, "decode")
        for e in r["timeline"]:
            if e["lane"] == "compute":
                kind = "step" if e["level"] == "step" else "pass"
                out[kind].append((e["end"] - e["start"], _overlap_s(e["start"], e["end"], decode)))
    return out


def _alone_s(events: list[tuple[float, float]]) -> float:
    """Median seconds of the events no decode overlapped (all of them if every one was)."""
    alone = [d for d, o in events if o == 0] or [d for d, _ in events]
    return statistics.median(alone)


def contention_cores(reports: list[dict]) -> float:
    """The page's CPU sharing, measured from its timelines in the units :class:`sakura_core.runtime.sim_cpu.CpuShare`
    charges: a DiT event of ``alone`` seconds (the median of its kind no decode overlapped: DiT steps, template-pass
    layers) that a decode overlapped takes ``overlap_alone / cores`` longer, ``overlap_alone`` being the part of its
    work the decode ran beside (its overlapped fraction of ``alone``). ``cores`` = the sum of those overlaps over the
    sum of the extra seconds, over every overlapped event; 0 = no sharing measured (no overlap, or no slowdown). Below
    1: a decode costs the DiT more than its own time (on a loaded 2-core host the page's main thread, streaming the
    transfers and passing the decodes' messages, works beside it too)."""
    shared = extra = 0.0
    for events in _compute_events(reports).values():
        if not events:
            continue
        alone = _alone_s(events)
        for d, o in events:
            if o > 0:
                shared, extra = shared + alone * o / d, extra + d - alone
    return shared / extra if extra > 0 else 0.0


def decode_slowdown(reports: list[dict], decode_s: dict[tuple[int, str], float]) -> float:
    """The page's decode seconds over the ladders' (``decode_s[(shard, level name)]``, the manifest's, measured where
    the template was published): the median ratio over the page's decode events; 1.0 when none matches."""
    ratios = [
        (e["end"] - e["start"]) / decode_s[(e["layer"], e["level"])]
        for r in reports
        for e in r["timeline"]
        if e["lane"] == "decode" and decode_s.get((e["layer"], e["level"]), 0) > 0
    ]
    return statistics.median(ratios) if ratios else 1.0


def page_profile(
    reports: list[dict], layers: int, steps: int, decode_s: dict[tuple[int, str], float] | None = None
) -> LiveProfile:
    """The page's compute profile from its timelines: a DiT step's seconds (compute events of level "step") over the
    layers is a cached layer; a template-pass layer (the other compute events) added to it is a full layer; both the
    medians of the events no decode overlapped. The CPU the page's decode shares with the DiT: ``dit_cpu_cores``
    (:func:`contention_cores`) and ``cpu_slowdown`` (:func:`decode_slowdown`, the page's decodes vs the ladders')."""
    events = _compute_events(reports)
    if not events["step"] or not events["pass"]:
        raise RuntimeError(
            f"the page's timelines hold {len(events['step'])} DiT steps and {len(events['pass'])} "
            "template-pass layers: the profile needs both (an on-device run computes the template "
            "pass)"
        )
    cached = _alone_s(events["step"]) / layers
    return LiveProfile(
        cached + _alone_s(events["pass"]),
        cached,
        layers,
        steps,
        dit_cpu_cores=contention_cores(reports),
        cpu_slowdown=decode_slowdown(reports, decode_s or {}),
    )


def _pre_lanes_s(report: dict) -> float:
    """Seconds the edit waited before its lanes began, measured: the manifest (0 once the page fetched it while the
    model loaded; a round trip when the edit had to) and the template image (fetched before the lanes)."""
    t = report["timings_s"]
    return t["manifest"] + t["template_image"]


def _bound(report: dict) -> float:
    """The busy-time bound: the busiest lane (the page's busy seconds: the DiT's include what the decodes beside it
    cost it) after the serial work before the lanes (:func:`_pre_lanes_s`)."""
    b = report["busy_s"]
    return _pre_lanes_s(report) + max(b["fetch"], b["decode"], b["compute"])


def _decode_s(manifest: dict) -> dict[tuple[int, str], float]:
    """The ladders' decode seconds of every (shard, level) the page's policies may fetch, closed-loop twins included."""
    out: dict[tuple[int, str], float] = {}
    for name in PAGE_POLICIES:
        for g, ladder in enumerate(plan_fetch(manifest, name).ladders):
            for lv in ladder:
                out[(g, lv.name)] = lv.decode_s
                if lv.closed is not None:
                    out[(g, lv.closed.name)] = lv.closed.decode_s
    return out


def _replay(trace, profile: LiveProfile, manifest: dict, rtt_s: float, ahead: dict[str, bool]) -> dict:
    """Simulated latency of each policy on ``trace`` with the page's ``profile`` and the served ladders; each
    policy's requests as the page's fetch lane sent them (``ahead``: policy -> the report's ``request_ahead``, the
    page's setting at the edit's end: requests ahead of the wire, or one at a time). The template image on the trace
    before the lanes, seeding the estimator, where the page fetches it first (:data:`IMAGE_FIRST`)."""
    from sakura_core.runtime.oracle import simulate_oracle
    from sakura_core.runtime.simulate import SimConfig, simulate

    out = {}
    for name in (*PAGE_POLICIES, "oracle"):  # the oracle: sakura's ladders, the trace known (the ceiling)
        plan = plan_fetch(manifest, "sakura" if name == "oracle" else name)
        fam = plan.policy.family
        out[name] = (simulate_oracle if name == "oracle" else simulate)(
            plan.policy,
            trace,
            profile,
            {fam: plan.ladders},
            {fam: plan.floor},
            config=SimConfig(rtt_s=rtt_s, request_ahead=ahead["sakura" if name == "oracle" else name]),
            template_image_bytes=manifest["template_image"]["bytes"] if name in IMAGE_FIRST else 0,
        ).result.latency_s
    return out


def _row(trace, by: dict, profile: LiveProfile, manifest: dict) -> dict:
    """One trace's live and simulated latencies (the simulator's oracle beside them: ``ceiling_vs_on-device`` is
    on-device's simulated latency over the oracle's, the most any policy could gain on this link and device) and
    sakura's speed-ups."""
    rtt = statistics.median(by[(trace.name, p)]["rtt_s"] for p in PAGE_POLICIES)
    ahead = {p: by[(trace.name, p)]["request_ahead"] for p in PAGE_POLICIES}
    # the simulated edit after the serial work the page measured before it (per run; the oracle: sakura's): the
    # manifest's wait, and the image where the simulator does not fetch it itself
    sim = {
        p: sec
        + by[(trace.name, "sakura" if p == "oracle" else p)]["manifest_wait_s" if p in IMAGE_FIRST else "pre_lanes_s"]
        for p, sec in _replay(trace, profile, manifest, rtt, ahead).items()
    }
    live = {p: by[(trace.name, p)]["latency_s"] for p in PAGE_POLICIES}
    row = {
        "trace": trace.name,
        "live_latency_s": live,
        "live_repeats_s": {p: by[(trace.name, p)]["repeats_latency_s"] for p in PAGE_POLICIES},
        "sim_latency_s": sim,
        "sim_rtt_s": rtt,
        "request_ahead": ahead,
        "ceiling_vs_on-device": sim["on-device"] / sim["oracle"],
    }
    for base in ("on-device", "fetch-fp16"):
        lv, sm = live[base] / live["sakura"], sim[base] / sim["sakura"]
        row[f"speedup_vs_{base}"] = {"live": lv, "sim": sm, "live_over_sim": lv / sm}
    row["latency_over_bound"] = {p: by[(trace.name, p)]["latency_over_bound"] for p in PAGE_POLICIES}
    return row


def _traces(args) -> list:
    from sakura_core.fetch.traces import load_trace

    names = [n.strip() for n in args.page_traces.split(",") if n.strip()][: args.max_traces]
    folder = Path(args.traces)
    missing = [n for n in names if not (folder / f"{n}.log").is_file()]
    if missing:
        raise SystemExit(
            f"sakura bench e2e --mode page: no trace {missing} in {folder} (write them with "
            f"`sakura traces synth --out {folder}`, or pick others with --page-traces)"
        )
    return [load_trace(folder / f"{n}.log") for n in names]


def run_page(args) -> int:
    from cloud_server.store import LocalStore

    from .cli_live import start_server
    from .page_driver import PageBench

    traces = _traces(args)
    steps = args.steps
    with tempfile.TemporaryDirectory(prefix="sakura-page-") as tmp:
        t0 = time.perf_counter()
        store_dir, model_dir = _publish(Path(tmp), steps)
        manifest = LocalStore(store_dir).get_manifest(TEMPLATE_ID)
        layers = manifest["num_layers"]
        print(
            f"PAGE: web model and per-step template ({layers} layers x {steps} steps) ready in "
            f"{time.perf_counter() - t0:.1f} s; CPU throttle {args.cpu_throttle}x; {len(traces)} traces"
        )
        proc, url = start_server(str(store_dir), wrap=lambda argv: argv + ["--phone-model", str(model_dir)])
        try:
            # --requests sequential: the page's fetch lane one request at a time (?requests=sequential)
            query = "" if requests_ahead(args) else "?requests=sequential"
            bench = PageBench(f"{url}/phone{query}", Path(tmp) / "photo.png", PROMPT)
            try:
                bench.edit(TEMPLATE_ID, "sakura", steps)  # warm-up (unshaped, not counted): ORT's sessions compiled
                runs = _run_all(bench, traces, steps, args.cpu_throttle, args.page_repeats)
            finally:
                bench.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    out = _compare(runs, traces, manifest, layers, steps, args)
    atomic_write_json(args.json, out)
    print(f"wrote {args.json}")
    return 0


def _run_all(bench, traces, steps: int, throttle: float, repeats: int = 1) -> list[dict]:
    """Every trace's policies in turn, ``repeats`` rounds (interleaved, so a drift in the host's load spreads over
    every policy); per trace and policy the run of median latency (the lower middle one of an even count) with every
    try's latency beside it (``repeats_latency_s``) and every try's report for the profile (``_reports``)."""
    tried: dict[tuple[str, str], list[dict]] = {}
    for _ in range(repeats):
        for trace in traces:
            for policy in PAGE_POLICIES:
                rep = bench.edit(TEMPLATE_ID, policy, steps, trace=trace, cpu_throttle=throttle)
                tried.setdefault((trace.name, policy), []).append(_run_row(trace.name, policy, rep))
    runs = []
    for trace in traces:
        for policy in PAGE_POLICIES:
            tries = tried[(trace.name, policy)]
            run = dict(sorted(tries, key=lambda r: r["latency_s"])[(len(tries) - 1) // 2])
            run["repeats_latency_s"] = [r["latency_s"] for r in tries]
            run["_reports"] = [r["_report"] for r in tries]
            runs.append(run)
    return runs


def _run_row(trace: str, policy: str, rep: dict) -> dict:
    """One page edit's figures (and its report, ``_report``), printed as a line."""
    latency, bound = rep["timings_s"]["total"], _bound(rep)
    print(
        f"{trace:<18} {policy:<11} {latency:7.2f} s  {rep['bytes_fetched'] / 1e6:6.2f} MB  "
        f"bound {bound:.2f} s (x{latency / bound:.2f}; before the lanes {_pre_lanes_s(rep):.3f} s)  "
        f"split {rep['split_layers']}  policy {rep.get('policy_s', 0.0) * 1e3:.0f} ms / {rep.get('policy_calls', 0)} asks"
    )
    return {
        "trace": trace,
        "policy": policy,
        "latency_s": latency,
        "bytes_fetched": rep["bytes_fetched"],
        "busy_s": rep["busy_s"],
        "pre_lanes_s": _pre_lanes_s(rep),
        "manifest_wait_s": rep["timings_s"]["manifest"],
        "bound_s": bound,
        "latency_over_bound": latency / bound,
        "rtt_s": rep["rtt_s"],
        "request_ahead": bool(rep.get("request_ahead", False)),  # a page before requests ahead: off
        "split_layers": rep["split_layers"],
        "_report": rep,
    }


def _compare(runs: list[dict], traces, manifest: dict, layers: int, steps: int, args) -> dict:
    """The simulator's replay of each trace with the page's profile; the table of live vs simulated speed-ups."""
    profile = page_profile([rep for r in runs for rep in r.pop("_reports")], layers, steps, _decode_s(manifest))
    for r in runs:  # each compared run's page report (timeline, decisions) kept for the diagnosis
        r["report"] = r.pop("_report")
    print(
        f"\npage's compute profile: DiT step {profile.layer_cached_s * layers:.3f} s, template-pass layer "
        f"{profile.layer_full_s - profile.layer_cached_s:.3f} s (medians of the timelines, no decode beside); "
        f"decodes share the DiT's CPU as {profile.dit_cpu_cores:.2f} cores, {profile.cpu_slowdown:.1f}x the "
        f"ladders' decode_s"
    )
    by = {(r["trace"], r["policy"]): r for r in runs}
    rows = []
    print(
        f"{'trace':<18} {'policy':<11} {'live s':>7} {'sim s':>7} {'x bound':>7}  {'vs on-device live/sim':>22}  "
        f"{'vs fetch-fp16 live/sim':>23}"
    )
    for trace in traces:
        row = _row(trace, by, profile, manifest)
        rows.append(row)
        live, sim = row["live_latency_s"], row["sim_latency_s"]
        for p in (*PAGE_POLICIES, "oracle"):
            cells: tuple[str, ...] = ("", "")
            if p == "sakura":
                cells = tuple(
                    f"{row[f'speedup_vs_{b}']['live']:.2f}x / {row[f'speedup_vs_{b}']['sim']:.2f}x"
                    for b in ("on-device", "fetch-fp16")
                )
            elif p == "oracle":
                cells = (f"ceiling {row['ceiling_vs_on-device']:.2f}x", "")
            print(
                f"{trace.name:<18} {p:<11} {live.get(p, float('nan')):7.2f} {sim[p]:7.2f} "
                f"{row['latency_over_bound'].get(p, float('nan')):7.2f}  {cells[0]:>22}  {cells[1]:>23}"
            )
    targets = {
        "sakura_fastest_each_trace": all(
            r["live_latency_s"]["sakura"] < min(r["live_latency_s"]["on-device"], r["live_latency_s"]["fetch-fp16"])
            for r in rows
        ),
        "live_over_sim_within_20pct": all(
            abs(r[f"speedup_vs_{b}"]["live_over_sim"] - 1) <= 0.2 for r in rows for b in ("on-device", "fetch-fp16")
        ),
        "latency_within_1_15x_bound": all(r["latency_over_bound"] <= 1.15 for r in runs),
    }
    print(f"targets: {targets}")
    return {
        "mode": "page",
        "template": {"id": TEMPLATE_ID, "kv_mode": "per-step", "layers": layers, "steps": steps},
        "cpu_throttle": args.cpu_throttle,
        "traces": [t.name for t in traces],
        "policies": list(PAGE_POLICIES),
        "profile": {
            "layer_full_s": profile.layer_full_s,
            "layer_cached_s": profile.layer_cached_s,
            "template_pass_s": profile.template_pass_s,
            "layers": layers,
            "steps": steps,
            "dit_cpu_cores": profile.dit_cpu_cores,
            "cpu_slowdown": profile.cpu_slowdown,
        },
        "runs": runs,
        "comparison": rows,
        "targets": targets,
    }
