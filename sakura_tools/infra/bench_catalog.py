"""``sakura bench catalog``: the cloud side at scale, in one run, on a real S3 server.

1. Precompute throughput: N demo templates (single KV mode) published into the object store by 1 and by 2 workers
   (``LocalRunner`` processes, or ``--ray ADDRESS``), each into a fresh prefix: templates per minute and the ratio.
   A worker's model load is part of its wall time (a fresh worker pays it once).
2. Shard GET throughput and latency through ``sakura serve`` over the object store vs over a local folder holding
   the same shards, and through nginx's ``proxy_cache`` in front of the S3-backed server (its CDN hit ratio: 1 -
   origin shard requests / requests, from the server's ``/metrics``).

The S3 server is ``--s3 s3://bucket/prefix`` (with ``--s3-endpoint`` and the AWS variables), or by default a
single-node Ceph radosgw started for the run in a temporary folder. Prints a table and writes JSON (``--json``).
Everything binds 127.0.0.1.
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import asyncio
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from cloud_server.catalog import load_catalog
from cloud_server.catalog_jobs import LocalRunner, make_job
from cloud_server.store import LocalStore
from cloud_server.store_url import S3_ENDPOINT_HELP, open_store

from .loadgen import load
from .nginx import NginxError, NginxProcess, find_nginx
from .random_shards import put_random_shards

__all__ = ["add_arguments", "bench_s3_store", "run"]

_SAMPLES = ("astronaut", "coffee", "chelsea", "rocket")


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, help="write the results here")
    parser.add_argument("--templates", type=int, default=4, help="templates precomputed per worker count (default 4)")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare (comma list; default 1,2)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="precompute runs per worker count, interleaved (order reversed each repeat); the fastest "
        "counts: drifting background load then hits both counts alike (default 1)",
    )
    parser.add_argument("--ray", default=None, metavar="ADDRESS", help="precompute on this Ray cluster instead")
    parser.add_argument("--s3", default=None, help="an S3 store to use (default: start a local radosgw)")
    parser.add_argument("--s3-endpoint", default=None, help=S3_ENDPOINT_HELP)
    parser.add_argument("--requests", type=int, default=3000, help="shard GETs per serving run (default 3000)")
    parser.add_argument("--connections", type=int, default=32, help="concurrent connections (default 32)")
    parser.add_argument("--sizes-kib", default="64,256", help="shard sizes (KiB, comma list; default 64,256)")
    parser.add_argument("--layers", type=int, default=16, help="shards per size (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request order")


# ---- the S3 store -----------------------------------------------------------------------------------------------
def bench_s3_store(args, work: Path):
    """(store URL, endpoint, radosgw or None): ``--s3`` as given, or a bucket on a radosgw started in ``work``."""
    if args.s3:
        return args.s3.rstrip("/") + f"/bench-{uuid.uuid4().hex[:8]}", args.s3_endpoint, None
    from .radosgw import RadosGateway

    gw = RadosGateway(work / "radosgw").start()
    os.environ.update(gw.env())  # for this process and the servers and workers it starts
    print(f"radosgw started in {sum(gw.timings_s.values()):.1f} s ({gw.timings_s}) at {gw.endpoint_url}", flush=True)
    from cloud_server.s3_store import S3Store

    store = open_store("s3://sakura-bench", endpoint_url=gw.endpoint_url)
    assert isinstance(store, S3Store)  # an s3:// URL opens an S3Store
    store.create_bucket()
    return f"s3://sakura-bench/run-{uuid.uuid4().hex[:8]}", gw.endpoint_url, gw


# ---- 1: precompute throughput -----------------------------------------------------------------------------------
def _catalog(work: Path, n: int) -> Path:
    """``n`` templates: the demo samples, then seeded random images."""
    from PIL import Image

    templates = []
    for i in range(n):
        if i < len(_SAMPLES):
            templates.append({"name": f"t{i}", "image": _SAMPLES[i]})
            continue
        rng = np.random.default_rng(i)
        path = work / f"t{i}.png"
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
        templates.append({"name": f"t{i}", "image": str(path)})
    path = work / "catalog.json"
    path.write_text(json.dumps({"version": 1, "templates": templates, "models": {"demo": "demo"}}))
    return path


def _precompute_all(args, catalog: Path, store_url: str, endpoint: str | None, counts: list[int]) -> list[dict]:
    """Every worker count ``--repeats`` times, interleaved; per count the fastest run (with every run's wall)."""
    runs: dict[int, list[dict]] = {w: [] for w in counts}
    for r in range(args.repeats):
        for w in counts if r % 2 == 0 else counts[::-1]:
            runs[w].append(_precompute(args, catalog, f"{store_url}/r{r}", endpoint, w))
    return [{**min(rows, key=lambda x: x["wall_s"]), "walls_s": [x["wall_s"] for x in rows]} for rows in runs.values()]


def _precompute(args, catalog: Path, store_url: str, endpoint: str | None, workers: int) -> dict:
    entries = load_catalog(catalog)
    prefix = f"{store_url}/w{workers}"
    jobs = [make_job(e, prefix, endpoint, "cpu", None) for e in entries]
    t0 = time.perf_counter()
    if args.ray:
        from cloud_server.catalog_ray import run_on_ray

        results = run_on_ray(jobs, address=args.ray, namespace=f"bench-{uuid.uuid4().hex[:6]}")
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        results = LocalRunner(workers, threads=threads).run(jobs)
    wall = time.perf_counter() - t0
    failed = [r for r in results if r["status"] != "published"]
    if failed:
        raise RuntimeError(f"{len(failed)} entries failed: {failed[0]}")
    row = {
        "workers": workers,
        "templates": len(jobs),
        "wall_s": round(wall, 2),
        "templates_per_min": round(60 * len(jobs) / wall, 2),
        "entry_s_median": round(float(np.median([r["seconds"] for r in results])), 2),
    }
    print(
        f"  precompute, {workers} worker(s): {len(jobs)} templates in {wall:.1f} s "
        f"({row['templates_per_min']:.2f}/min)",
        flush=True,
    )
    return row


# ---- 2: shard GETs ----------------------------------------------------------------------------------------------
def _publish_shards(stores: list, args) -> tuple[list[str], list[int]]:
    sizes = tuple(int(float(k) * 1024) for k in args.sizes_kib.split(",") if k.strip())
    blobs = put_random_shards(stores, args.layers, list(sizes))  # GET by digest only: no manifest needed
    return list(blobs), [len(b) for b in blobs.values()]


def _serve(store: str, endpoint: str | None, log: Path) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "sakura_core.cli", "serve", "--store", store, "--port", "0", "--model", "none"]
    cmd += ["--s3-endpoint", endpoint] if endpoint else []
    env = {k: v for k, v in os.environ.items() if k not in ("SAKURA_TOKEN", "SAKURA_READ_TOKEN")}
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline().decode()
    if not line.startswith("serving http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError(f"sakura serve did not start: {line!r} {log.read_text()[-2000:]}")
    return proc, int(line.split()[1].rsplit(":", 1)[1])


def _origin_shard_requests(port: int) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in io.TextIOWrapper(r, encoding="utf-8"):
            if line.startswith('sakura_requests_total{route="shard"}'):
                return int(float(line.split()[-1]))
    return 0


def _get_run(name: str, port: int, origin: int, digests, sizes, args) -> dict:
    before = _origin_shard_requests(origin)
    run, wall = asyncio.run(load(port, digests, sizes, args.connections, args.requests, args.seed, 60.0))
    origin_hits = _origin_shard_requests(origin) - before
    lat = np.asarray(run.latencies_s) * 1e3
    done = len(run.latencies_s)
    row = {
        "server": name,
        "requests": args.requests,
        "completed": done,
        "errors": sum(run.errors.values()),
        "req_per_s": round(done / wall, 1),
        "mb_per_s": round(run.bytes / wall / 1e6, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if done else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if done else None,
        "origin_shard_requests": origin_hits,
        "cdn_hit_ratio": round(1 - origin_hits / max(done, 1), 4) if name.startswith("nginx") else None,
    }
    print(
        f"  GET {name:<14}{row['req_per_s']:>8.0f} req/s {row['mb_per_s']:>7.1f} MB/s p99 {row['p99_ms']} ms, "
        f"errors {row['errors']}",
        flush=True,
    )
    return row


def _serving(args, work: Path, store_url: str, endpoint: str | None) -> tuple[list[dict], str | None]:
    local = LocalStore(work / "local-store")
    s3_url = f"{store_url}/serve"
    digests, sizes = _publish_shards([local, open_store(s3_url, endpoint_url=endpoint)], args)
    procs = []
    nginx, note = None, None
    try:
        procs.append(_serve(str(local.root), None, work / "serve-local.log"))
        procs.append(_serve(s3_url, endpoint, work / "serve-s3.log"))
        (_, local_port), (_, s3_port) = procs
        servers = [("sakura local", local_port, local_port), ("sakura s3", s3_port, s3_port)]
        if find_nginx() is None:
            note = "nginx not installed (apt-get install nginx-light): no CDN row"
        else:
            try:
                nginx = NginxProcess(work / "nginx", upstream_port=s3_port).start()
                servers.append(("nginx cdn->s3", nginx.port, s3_port))
            except NginxError as e:
                note = f"nginx did not start: {e}"
        rows = []
        for name, port, origin in servers:  # a short warm-up, then the measured run
            asyncio.run(load(port, digests, sizes, 4, 2 * len(digests), args.seed + 1, 60.0))
            rows.append(_get_run(name, port, origin, digests, sizes, args))
        return rows, note
    finally:
        if nginx is not None:
            nginx.stop()
        for proc, _ in procs:
            proc.terminate()
            proc.wait(30)


# ---- report -----------------------------------------------------------------------------------------------------
def _print_tables(pre: list[dict], gets: list[dict], ratio: float | None) -> None:
    print(f"\n{'workers':>7} {'templates':>9} {'wall s':>8} {'tpl/min':>8} {'entry s (median)':>17}")
    for r in pre:
        print(
            f"{r['workers']:>7} {r['templates']:>9} {r['wall_s']:>8.1f} {r['templates_per_min']:>8.2f} "
            f"{r['entry_s_median']:>17.1f}"
        )
    if ratio is not None:
        print(f"throughput ratio {pre[-1]['workers']} vs {pre[0]['workers']} workers: {ratio:.2f}x")
    print(
        f"\n{'server':<14} {'done':>6} {'errors':>6} {'req/s':>8} {'MB/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'CDN hit':>7}"
    )
    for r in gets:
        hit = "-" if r["cdn_hit_ratio"] is None else f"{r['cdn_hit_ratio']:.3f}"
        print(
            f"{r['server']:<14} {r['completed']:>6} {r['errors']:>6} {r['req_per_s']:>8.0f} {r['mb_per_s']:>7.1f} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {hit:>7}"
        )


def run(args) -> int:
    try:
        counts = [int(x) for x in args.workers.split(",") if x.strip()]
        if not counts or min(counts) < 1 or min(args.templates, args.requests, args.connections, args.repeats) < 1:
            raise ValueError("--workers, --templates, --repeats, --requests and --connections must be positive")
    except ValueError as e:
        print(f"sakura bench catalog: {e}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sakura-bench-catalog-"))
    gw = None
    try:
        store_url, endpoint, gw = bench_s3_store(args, work)
        catalog = _catalog(work, args.templates)
        pre = _precompute_all(args, catalog, store_url, endpoint, counts)
        gets, note = _serving(args, work, store_url, endpoint)
    finally:
        if gw is not None:
            gw.stop()
        shutil.rmtree(work, ignore_errors=True)
    ratio = round(pre[-1]["templates_per_min"] / pre[0]["templates_per_min"], 2) if len(pre) > 1 else None
    report = {
        "bench": "catalog",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]},
        "config": {
            "templates": args.templates,
            "workers": counts,
            "precompute": f"Ray {args.ray}" if args.ray else "local worker processes",
            "kv_mode": "single",
            "model": "demo (cpu, float32)",
            "s3": args.s3 or "Ceph radosgw 16 (single node, memstore OSD) started for the run",
            "requests": args.requests,
            "connections": args.connections,
            "sizes_kib": args.sizes_kib,
            "shards": args.layers * len(args.sizes_kib.split(",")),
            "nginx": note or "proxy_cache in front of the S3-backed server",
        },
        "precompute": pre,
        "precompute_ratio": ratio,
        "shard_gets": gets,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    _print_tables(pre, gets, ratio)
    if note:
        print(note)
    print(f"wrote {args.json}")
    return 0
