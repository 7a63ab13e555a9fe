"""``sakura bench serve``: load-test ``sakura serve`` and nginx serving the same shard files, over loopback.

For each connection count (default 50, 200, 1000) and each server, N keep-alive connections fetch shards (random
digests, seeded) until a bounded number of requests is done. Measured per run: requests/s, MB/s, p50/p99 request
latency, connect p99, errors (by kind), server CPU time per request, server RSS before and after. The load generator
is a lean non-blocking socket client in this process; on a small machine it shares the CPUs with the server, which
caps the faster server first — the server CPU time per request is the comparison that does not depend on that.

Prints a table and writes JSON (``--json``). Binds only 127.0.0.1.
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import asyncio
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cloud_server.store import LocalStore

from .loadgen import cpu_s, load, rss_bytes
from .nginx import NginxError, NginxProcess, find_nginx
from .random_shards import put_random_shards

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, help="write the results here")
    parser.add_argument("--connections", default="50,200,1000", help="concurrent connections per run (comma list)")
    parser.add_argument("--requests", type=int, default=6000, help="requests per run (at least 2 per connection)")
    parser.add_argument("--sizes-kib", default="16,64,256,1024", help="shard sizes of the ladder (KiB, comma list)")
    parser.add_argument("--layers", type=int, default=8, help="shards per ladder level (default: %(default)s)")
    parser.add_argument("--store", default=None, help="serve the shards of this store instead of random ones")
    parser.add_argument("--no-nginx", action="store_true", help="only the SAKURA server")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request order")
    parser.add_argument("--soak", type=int, default=2, help="extra SAKURA runs at the top level (RSS growth check)")


# ---- orchestration --------------------------------------------------------------------------------------------
def _start_sakura(store_dir: Path, log_path: Path) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "sakura_core.cli", "serve", "--store", str(store_dir), "--host", "127.0.0.1"]
    cmd += ["--port", "0", "--model", "none", "--backlog", "4096"]
    env = {k: v for k, v in os.environ.items() if k not in ("SAKURA_TOKEN", "SAKURA_READ_TOKEN")}
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline().decode()
    if not line.startswith("serving http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError(f"sakura serve did not start: {line!r} {log_path.read_text()[-2000:]}")
    return proc, int(line.split()[1].rsplit(":", 1)[1])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else float("nan")


def _measure(name, port, pids_fn, digests, sizes, conns, n_requests, seed, timeout_s) -> dict:
    pids = pids_fn()
    rss_before, cpu_before = rss_bytes(pids), cpu_s(pids)
    gen_cpu0 = time.process_time()
    run, wall_s = asyncio.run(load(port, digests, sizes, conns, n_requests, seed, timeout_s))
    gen_cpu = time.process_time() - gen_cpu0
    pids = pids_fn()
    cpu = cpu_s(pids) - cpu_before
    done = len(run.latencies_s)
    return {
        "server": name,
        "connections": conns,
        "requests": n_requests,
        "completed": done,
        "errors": sum(run.errors.values()),
        "error_kinds": run.errors,
        "wall_s": round(wall_s, 3),
        "req_per_s": round(done / wall_s, 1),
        "mb_per_s": round(run.bytes / wall_s / 1e6, 1),
        "p50_ms": round(_pct(run.latencies_s, 50), 2),
        "p99_ms": round(_pct(run.latencies_s, 99), 2),
        "connect_p99_ms": round(_pct(run.connect_s, 99), 2),
        "server_cpu_s": round(cpu, 3),
        "server_cpu_ms_per_req": round(1e3 * cpu / max(done, 1), 4),
        "loadgen_cpu_s": round(gen_cpu, 3),
        "rss_before_mib": round(rss_before / 2**20, 1),
        "rss_after_mib": round(rss_bytes(pids) / 2**20, 1),
    }


def _table(runs: list[dict]) -> str:
    cols = [
        ("server", "{:<7}"),
        ("connections", "{:>6}"),
        ("completed", "{:>7}"),
        ("errors", "{:>6}"),
        ("req_per_s", "{:>9.0f}"),
        ("mb_per_s", "{:>8.0f}"),
        ("p50_ms", "{:>8.1f}"),
        ("p99_ms", "{:>8.1f}"),
        ("connect_p99_ms", "{:>8.1f}"),
        ("server_cpu_ms_per_req", "{:>8.3f}"),
        ("rss_before_mib", "{:>7.1f}"),
        ("rss_after_mib", "{:>7.1f}"),
    ]
    head = [
        "server",
        "conns",
        "done",
        "errors",
        "req/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "conn p99",
        "cpu ms/r",
        "RSS0",
        "RSS1",
    ]
    widths = [len(fmt.format(runs[0][k])) if runs else 8 for k, fmt in cols]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True)))]
    for r in runs:
        lines.append("  ".join(fmt.format(r[k]) for k, fmt in cols))
    return "\n".join(lines)


def _ensure_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def run(args) -> int:
    lists = _parse_lists(args)
    if lists is None:
        return 2
    levels, sizes_kib = lists
    _ensure_fd_limit(4 * max(levels) + 256)
    work = Path(tempfile.mkdtemp(prefix="sakura-bench-serve-"))
    try:
        shards = _shards(args, work, sizes_kib)
        if shards is None:
            return 2
        store, digests = shards
        sizes = [store.shard_path(d).stat().st_size for d in digests]
        print(
            f"shards: {len(digests)}, {min(sizes) / 1024:.0f}-{max(sizes) / 1024:.0f} KiB "
            f"(mean {np.mean(sizes) / 1024:.0f} KiB); {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        proc, port = _start_sakura(store.root, work / "sakura.log")
        servers = [("sakura", port, lambda: [proc.pid])]
        nginx, nginx_note = _start_nginx(args, work, store, servers)
        rss_start = _rss_mib(servers)
        try:
            runs, soak = _measure_levels(servers, digests, sizes, levels, args)
            rss_end = _rss_mib(servers)
        finally:
            _stop(proc)
            if nginx is not None:
                nginx.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ratios = _ratios(runs, levels)
    top = max(levels)
    rss_top = next(r["rss_after_mib"] for r in runs if r["server"] == "sakura" and r["connections"] == top)
    rss = {
        "start": rss_start,
        "end": rss_end,
        "sakura_after_first_top_level_run": rss_top,
        "sakura_after_each_soak_run": [r["rss_after_mib"] for r in soak],
        "sakura_growth_over_soak": round(rss_end["sakura"] - rss_top, 1),  # over the soak repeats
    }
    targets = _targets(runs, soak, top, rss_end["sakura"] - rss_top, rss_top, ratios)
    report = {
        "bench": "serve",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]},
        "config": _config(args, levels, digests, sizes, nginx_note),
        "rss_mib": rss,
        "runs": runs,
        "soak_runs": soak,
        "ratios": ratios,
        "targets": targets,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    _print_summary(runs, ratios, rss, top, targets, args.json)
    return 0


def _parse_lists(args) -> tuple[list[int], list[float]] | None:
    """The connection levels and shard sizes; None (after saying why) when the arguments are bad."""
    try:
        levels = [int(x) for x in args.connections.split(",") if x.strip()]
        sizes_kib = [float(x) for x in args.sizes_kib.split(",") if x.strip()]
    except ValueError as e:
        print(f"sakura bench serve: bad list: {e}", file=sys.stderr)
        return None
    if not levels or min(levels) < 1 or args.requests < 1 or args.layers < 1 or not sizes_kib or args.soak < 0:
        print(
            "sakura bench serve: --connections, --requests, --layers and --sizes-kib must be positive", file=sys.stderr
        )
        return None
    return levels, sizes_kib


def _shards(args, work: Path, sizes_kib: list[float]) -> tuple[LocalStore, list[str]] | None:
    """The store to serve and its shard digests: ``--store``'s, or random shards in ``work`` (a ladder of
    ``sizes_kib`` per layer)."""
    if args.store:
        store = LocalStore(args.store)
        digests = sorted(p.name for p in store.shards_dir.glob("*/*") if len(p.name) == 64)
        if not digests:
            print(f"sakura bench serve: no shards in {store.root}", file=sys.stderr)
            return None
        return store, digests
    store = LocalStore(work / "store")
    return store, list(put_random_shards([store], args.layers, [int(k * 1024) for k in sizes_kib]))


def _start_nginx(args, work: Path, store: LocalStore, servers: list) -> tuple[NginxProcess | None, str | None]:
    """Start nginx on the same files when asked and installed (appended to ``servers``); returns it and a note."""
    nginx = None
    nginx_note = None
    if args.no_nginx:
        nginx_note = "skipped (--no-nginx)"
    elif find_nginx() is None:
        nginx_note = "not installed (apt-get install nginx-light)"
    else:
        try:
            nginx = NginxProcess(work / "nginx", static_store=store.root, workers=1).start()
            servers.append(("nginx", nginx.port, lambda: [nginx.pid(), *nginx.worker_pids()]))
        except NginxError as e:
            nginx_note = f"did not start: {e}"
    if nginx_note:
        print(f"nginx: {nginx_note}", flush=True)
    return nginx, nginx_note


def _rss_mib(servers: list) -> dict[str, float]:
    return {name: round(rss_bytes(pids()) / 2**20, 1) for name, _, pids in servers}


def _measure_levels(servers: list, digests, sizes, levels: list[int], args) -> tuple[list[dict], list[dict]]:
    """Warm-up, one run per level and server (interleaved), then the soak repeats of SAKURA at the top level."""
    # warm-up: page cache and first connections, not measured
    for name, p, pids in servers:
        _measure(name, p, pids, digests, sizes, 20, 200, args.seed, args.timeout)
    runs = []
    for conns in levels:
        n = max(args.requests, 2 * conns)
        for name, p, pids in servers:  # interleaved, so background load drifts hit both alike
            r = _measure(name, p, pids, digests, sizes, conns, n, args.seed + conns, args.timeout)
            runs.append(r)
            print(
                f"  {name:<7}{conns:>6} conns: {r['req_per_s']:>8.0f} req/s {r['mb_per_s']:>7.0f} MB/s "
                f"p99 {r['p99_ms']:.1f} ms, errors {r['errors']}",
                flush=True,
            )
    # soak: the top level again; a leak shows as RSS that keeps growing from repeat to repeat
    soak = []
    _, port, pids = servers[0]
    for i in range(args.soak):
        r = _measure("sakura", port, pids, digests, sizes, max(levels), n, args.seed + i, args.timeout)
        soak.append(r)
        print(f"  soak {i + 1}/{args.soak}: errors {r['errors']}, RSS {r['rss_after_mib']} MiB", flush=True)
    return runs, soak


def _ratios(runs: list[dict], levels: list[int]) -> dict:
    """Per level with both servers: nginx/sakura requests per second, sakura/nginx server CPU per request (None when
    either server's CPU time is below the clock's resolution: a short run)."""
    ratios = {}
    for conns in levels:
        s = next(r for r in runs if r["server"] == "sakura" and r["connections"] == conns)
        n = next((r for r in runs if r["server"] == "nginx" and r["connections"] == conns), None)
        if n is not None:
            ratios[str(conns)] = {
                "nginx_over_sakura_req_per_s": round(n["req_per_s"] / max(s["req_per_s"], 1e-9), 2),
                "sakura_over_nginx_cpu_per_req": round(s["server_cpu_ms_per_req"] / n["server_cpu_ms_per_req"], 2)
                if n["server_cpu_ms_per_req"] > 0 and s["server_cpu_ms_per_req"] > 0
                else None,
            }
    return ratios


def _targets(runs, soak, top: int, rss_growth: float, rss_top: float, ratios: dict) -> dict:
    sak = [r for r in runs if r["server"] == "sakura"]
    return {
        f"zero_errors_at_{top}": all(r["errors"] == 0 for r in [*sak, *soak] if r["connections"] == top),
        "rss_flat": rss_growth <= max(4.0, 0.05 * rss_top) if soak else None,
        "within_2x_of_nginx_req_per_s": all(v["nginx_over_sakura_req_per_s"] <= 2.0 for v in ratios.values())
        if ratios
        else None,
    }


def _config(args, levels, digests, sizes, nginx_note) -> dict:
    return {
        "connections": levels,
        "requests_per_run": args.requests,
        "shards": len(digests),
        "shard_bytes": {"min": min(sizes), "max": max(sizes), "mean": int(np.mean(sizes))},
        "store": args.store or "synthetic",
        "nginx": nginx_note or "static files, worker_processes 1, sendfile on",
        "sakura": "sakura serve --model none (one process, aiohttp, sendfile)",
        "loadgen": "one process, non-blocking sockets, keep-alive, 1 in 25 bodies sha256-verified",
    }


def _print_summary(runs, ratios, rss, top, targets, json_path) -> None:
    print()
    print(_table(runs))
    for conns, v in ratios.items():
        cpu = v["sakura_over_nginx_cpu_per_req"]
        cpu = (
            "n/a (a server's CPU time is below the clock's resolution: more --requests)"
            if cpu is None
            else f"{cpu:.2f}x"
        )
        print(
            f"{conns:>5} conns: nginx/sakura req/s {v['nginx_over_sakura_req_per_s']:.2f}x, "
            f"sakura/nginx server CPU per request {cpu}"
        )
    print(
        f"RSS MiB: start {rss['start']}, after first {top}-connection run "
        f"{rss['sakura_after_first_top_level_run']}, after soak runs {rss['sakura_after_each_soak_run']}"
    )
    print(f"targets: {targets}")
    print(f"wrote {json_path}")
