"""``sakura bench e2e --mode live``: real ``sakura serve``, real shaped transfer, real decode, real compute here.

The live bench model (``live_model.json``: 8 layers, width 512, 1024 template tokens, 16 MiB fp16 KV, random
weights) is sized so one edit takes seconds on these CPUs. Its template is precomputed into a store with the sakura
and the CacheGen codecs (kept between runs, keyed by everything it depends on: :mod:`.live_cache`), served by a
``sakura serve`` subprocess on 127.0.0.1 (or inside a network namespace with ``--shaping kernel``), and every
policy edits over each trace. Per run: latency, bytes, PSNR vs the
exact-KV edit, split layer, and the pipeline's efficiency: latency / max(compute, transfer, decode busy time), with
compute busy time measured without the stalls inside it (:mod:`sakura_core.runtime.timeline`).

``--kv-mode per-step`` publishes the template with one KV per (step, layer) for ``--steps`` steps (the sakura codec;
CacheGen picks from its non-fp16 levels) and compares with the on-device edit that runs the template at every step.
``--plots DIR`` writes each run's timeline.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from sakura_core.fetch.link import shaped_fetcher
from sakura_core.fetch.traces import load_traces
from sakura_core.files import atomic_write_json
from sakura_core.metrics import psnr_tokens as psnr_db
from sakura_core.models.edit_model import ModelSpec, load_demo_model, load_image
from sakura_core.policy.plan import plan_fetch
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.lane_parts import EditInputs
from sakura_core.runtime.live_profile import measure_profile
from sakura_core.runtime.pipeline import LiveSettings, RuntimeConfig, run_pipelined_edit
from sakura_core.runtime.timeline import lower_bound

from .e2e_report import format_table, select_policies
from .live_cache import default_live_cache_dir, store_key, template_store
from .requests_flag import requests_ahead

__all__ = ["run_live", "start_server"]

PROMPT = "place it"


def start_server(store: str, host: str = "127.0.0.1", wrap=None) -> tuple[subprocess.Popen, str]:
    """Start ``sakura serve --model none`` on a free port; returns the process and its base URL."""
    argv = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "serve",
        "--store",
        store,
        "--host",
        host,
        "--port",
        "0",
        "--model",
        "none",
    ]
    if wrap is not None:
        argv = wrap(argv)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.stdout is None:  # not reached: stdout=PIPE
        raise RuntimeError("sakura serve started without a stdout pipe")
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        m = re.search(r"serving (http://\S+)", line)
        if m:
            return proc, m.group(1).rstrip("/")
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("sakura serve did not start (no 'serving http://...' line within 60 s)")


def _plot(args, trace: str, policy: str, rep, bound: dict) -> str | None:
    """The run's timeline as ``--plots/live.<kv mode>.<trace>.<policy>.png`` (None without ``--plots``)."""
    if not args.plots:
        return None
    from pathlib import Path

    from sakura_core.runtime.timeline_plot import plot_timeline

    path = Path(args.plots) / f"live.{rep.kv_mode}.{trace}.{policy}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_timeline(
        rep.result.events,
        path,
        f"live, {rep.kv_mode} KV, {policy}, {trace}: {rep.result.latency_s:.2f} s, bound "
        f"{bound['bound_s']:.2f} s (x{bound['latency_over_bound']:.2f})",
        rep.result.decisions,
    )
    return str(path)


def run_live(args) -> int:
    from cloud_server.store import LocalStore

    if args.kv_mode not in ("single", "per-step"):
        raise SystemExit(
            f"sakura bench e2e: --mode live takes one --kv-mode, single or per-step; got {args.kv_mode!r}"
        )

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    spec = ModelSpec.load(str(resources.files("sakura_tools.bench").joinpath("live_model.json")))
    model = load_demo_model(spec, weights=None)
    size = spec.image_size
    template, user = load_image("astronaut", size), load_image("chelsea", size)
    traces = load_traces(args.traces)[: args.max_traces]
    policies = [p for p in select_policies(args.policies, "live")]
    steps = args.steps
    kv_mode = args.kv_mode
    print(
        f"LIVE: model {spec.name} (random weights), {model.adapter.num_layers} layers, "
        f"{model.adapter.kv_bytes(spec.num_tokens) / 2**20:.0f} MiB fp16 KV; {len(traces)} traces; "
        f"shaping {args.shaping}"
    )
    profile = measure_profile(model, steps)
    print(
        f"compute here: layer with template {profile.layer_full_s * 1000:.0f} ms, cached {profile.layer_cached_s * 1000:.0f} ms"
    )
    if kv_mode == "per-step":  # the exact edit: the template at every step, at that step's time
        L = model.adapter.num_layers
        exact = run_edit(
            model,
            user,
            PROMPT,
            steps=steps,
            split_layer=L,
            template_image=template,
            template_every_step=True,
            kv_mode="per-step",
        ).tokens
    else:
        exact_kv = model.adapter.extract_template_kv(model.template_tokens(template), model.spec.grid)
        exact = run_edit(model, user, PROMPT, steps=steps, kv_source=exact_kv).tokens

    codecs = _codecs(kv_mode)
    key, inputs = store_key(model.adapter.model, asdict(spec), template, kv_mode, steps, codecs)
    with tempfile.TemporaryDirectory(prefix="sakura-live-") as tmp:
        store_dir = template_store(
            key,
            inputs,
            lambda d: _publish_ladders(LocalStore(d), model, template, kv_mode, steps),
            _cache_dir(args),
            tmp,
        )
        runs = _serve_and_run(args, store_dir, model, traces, policies, profile, template, user, exact)
    _report(args, spec, model, profile, runs)
    return 0


def _cache_dir(args) -> Path | None:
    """Where the template store is kept between runs (None: ``--no-live-cache``)."""
    if getattr(args, "no_live_cache", False):
        return None
    given = getattr(args, "live_cache", None)
    return Path(given).expanduser() if given else default_live_cache_dir()


def _codecs(kv_mode: str) -> tuple[str, ...]:
    """The codecs the live bench publishes: per-step mode sakura only (CacheGen then picks its non-fp16 levels)."""
    return ("sakura", "cachegen") if kv_mode == "single" else ("sakura",)


def _publish_ladders(store, model, template, kv_mode: str = "single", steps: int = 4) -> None:
    """Precompute the template with the sakura and the CacheGen codecs (per-step mode: sakura only, CacheGen then
    picks from its non-fp16 levels) and publish them into ``store``."""
    from cloud_server.precompute import publish_template
    from sakura_core.precompute import precompute_template

    t0 = time.perf_counter()
    for codec in _codecs(kv_mode):
        kw: dict[str, Any] = (
            {} if kv_mode == "single" else {"kv_mode": "per-step", "steps": steps, "held_out_probes": 1}
        )
        pre = precompute_template(model, template, f"live-{codec}", codec=codec, **kw)
        publish_template(
            store, model, template, f"live-{codec}", codec=codec, precompute_fn=lambda *a, _pre=pre, **k: _pre
        )
        levels = ", ".join(f"{r['name']} {r['psnr_db']:.1f}" for r in pre.manifest["shards"][0]["representations"])
        print(f"precomputed {codec} ladder (PSNR per level: {levels})")
    print(f"precompute took {time.perf_counter() - t0:.1f} s")
    print("store profile: full (every rung and the exact fp16 published: the fetch-fp16 baseline fetches it)")


def _serve_and_run(args, store_dir, model, traces, policies, profile, template, user, exact) -> list[dict]:
    """Serve ``store_dir`` (inside a network namespace with ``--shaping kernel``) and run every policy over it."""
    link = None
    if args.shaping == "kernel":
        from sakura_tools.infra.netns import NetnsConfig, NetnsLink, netns_available

        ok, why = netns_available()
        if not ok:
            raise SystemExit(f"sakura bench e2e: --shaping kernel unavailable: {why}")
        link = NetnsLink(NetnsConfig(subnet_index=77)).__enter__()
    try:
        if link is not None:
            proc, url = start_server(store_dir, host=link.ns_ip, wrap=link.exec_argv)
        else:
            proc, url = start_server(store_dir)
        try:
            return asyncio.run(_run_all(args, model, traces, policies, profile, template, user, exact, url, link))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        if link is not None:
            link.__exit__(None, None, None)


def _report(args, spec, model, profile, runs: list[dict]) -> None:
    """Print the table and the pipeline efficiency; write the JSON report."""
    from .e2e import summarize

    plans = {r["trace"]: r.pop("_plan") for r in runs if r["policy"] == "sakura"}
    for r in runs:
        r.pop("_plan", None)
    summary, ratios = summarize(runs)
    print()
    print(format_table(summary, ratios))
    sim_check = _sim_check(runs, plans, profile, args)
    eff = [r["latency_over_lower_bound"] for r in runs if r["policy"] in ("fetch-fp16", "sakura", "cachegen")]
    print(
        f"\npipeline efficiency (latency / max(compute, transfer, decode)), fetching policies: median "
        f"{statistics.median(eff):.3f}, max {max(eff):.3f}"
    )
    out = {
        "mode": "live",
        "model": {
            "name": spec.name,
            "weights": "random-init",
            "layers": model.adapter.num_layers,
            "kv_bytes_fp16": model.adapter.kv_bytes(spec.num_tokens),
        },
        "profile": {
            "name": "this-cpu",
            "layer_full_s": profile.layer_full_s,
            "layer_cached_s": profile.layer_cached_s,
        },
        "shaping": args.shaping,
        "store_profile": "full",  # precompute_template's default: every rung and the fp16 (fetch-fp16 reads it)
        "kv_mode": args.kv_mode,
        "runs": runs,
        "summary": summary,
        "ratios_vs_sakura": ratios,
        "pipeline_efficiency": {"median": statistics.median(eff), "max": max(eff)},
        "sim_check": sim_check,
    }
    atomic_write_json(args.json, json.loads(json.dumps(out, default=float)))
    print(f"wrote {args.json}")


def _sim_check(runs: list[dict], plans: dict, profile, args) -> list[dict]:
    """Replay each trace in the simulator with this run's inputs (the bench model's measured profile, the served
    ladders, the same trace and RTT) and compare sakura's speed-up over on-device, live vs simulated."""
    by = {(r["trace"], r["policy"]): r for r in runs}
    out = []
    traces = {t.name: t for t in load_traces(args.traces)}
    for name, (ladders, floor) in plans.items():
        if (name, "on-device") not in by or name not in traces:
            continue
        trace, lad = traces[name], {"sakura": ladders}
        ahead = requests_ahead(args)
        sim = _replay(trace, profile, lad, floor, ahead)
        alone = _replay(trace, replace(profile, dit_cpu_cores=0), lad, floor, ahead)
        live = by[(name, "on-device")]["latency_s"] / by[(name, "sakura")]["latency_s"]
        pred, pred_alone = sim["on-device"] / sim["sakura"], alone["on-device"] / alone["sakura"]
        row = {
            "trace": name,
            "live_speedup": live,
            "sim_speedup": pred,
            "live_over_sim": live / pred,
            "sim_latency_s": sim,
            "dit_cpu_cores": profile.dit_cpu_cores,
            "sim_speedup_no_contention": pred_alone,
        }
        out.append(row)
        shared = (
            f"; the DiT on all {profile.dit_cpu_cores} cores, each decode taking one: without that "
            f"{pred_alone:.2f}x, live / sim {live / pred_alone:.3f}"
            if profile.dit_cpu_cores
            else "; the decodes on cores the DiT leaves free"
        )
        print(
            f"sim check {name}: sakura vs on-device live {live:.2f}x, simulated {pred:.2f}x with this run's "
            f"profile, ladders and trace (live / sim {live / pred:.3f}{shared})"
        )
    return out


def _replay(trace, profile, ladders: dict, floor: int, request_ahead: bool = True) -> dict:
    """Simulated latency of sakura and on-device on ``trace`` with ``profile`` and the served ``ladders`` (requests
    sent ahead or one at a time, as the live run)."""
    from sakura_core.runtime.simulate import SimConfig, simulate

    cfg = SimConfig(rtt_s=RuntimeConfig().rtt_s, request_ahead=request_ahead)
    return {
        p: simulate(make_policy(p), trace, profile, ladders, {"sakura": floor}, config=cfg).result.latency_s
        for p in ("sakura", "on-device")
    }


async def _run_all(args, model, traces, policies, profile, template, user, exact, url, link):
    from sakura_core.fetch.client import ShardClient

    runs = []
    for trace in traces:
        for name in policies:
            codec = "cachegen" if name == "cachegen" and args.kv_mode == "single" else "sakura"
            tid = f"live-{codec}"
            follow = None
            async with ShardClient(url) as client:
                manifest = await client.get_manifest(tid)
                plan = plan_fetch(manifest, name)

                if link is not None:
                    stop = asyncio.Event()
                    follow = asyncio.create_task(link.follow(trace, 0.0, stop))
                try:
                    rep = await run_pipelined_edit(
                        EditInputs(model, user, PROMPT, template),
                        manifest,
                        shaped_fetcher(client, trace if link is None else None),
                        plan,
                        profile,
                        trace=trace,
                        config=RuntimeConfig(request_ahead=requests_ahead(args), live=LiveSettings(steps=args.steps)),
                    )
                finally:
                    if follow is not None:
                        stop.set()
                        await follow
            res = rep.result
            bound = lower_bound(res.events, res.latency_s)  # pure busy time: stalls are not compute
            timeline = _plot(args, trace.name, name, rep, bound)
            runs.append(
                {
                    "trace": trace.name,
                    "start_s": 0.0,
                    "policy": name,
                    "latency_s": res.latency_s,
                    "bytes_fetched": res.bytes_fetched,
                    "peak_kv_bytes": res.peak_kv_bytes,
                    "psnr_db": psnr_db(rep.tokens, exact),
                    "split_layer": res.split_layer,
                    "lower_bound_s": bound["bound_s"],
                    "latency_over_lower_bound": bound["latency_over_bound"],
                    "busy_s": {k: bound[k] for k in ("compute_busy_s", "fetch_busy_s", "decode_busy_s", "stall_s")},
                    "fallbacks": rep.fallbacks,
                    "kv_mode": rep.kv_mode,
                    "split_layers": res.split_layers,
                    "timeline_png": timeline,
                    "_plan": (plan.ladders, plan.floor),  # for the simulator replay (not written)
                }
            )
            split = res.split_layers if rep.kv_mode == "per-step" else res.split_layer
            print(
                f"{trace.name:<28} {name:<18} {res.latency_s:7.2f} s  {res.bytes_fetched / 2**20:7.2f} MiB  "
                f"KV held <= {res.peak_kv_bytes / 2**20:.2f} MiB  split {split}  "
                f"PSNR {runs[-1]['psnr_db']:.1f}  bound {bound['bound_s']:.2f} s "
                f"(x{bound['latency_over_bound']:.2f})"
            )
    return runs
