"""``sakura bench listing``: ``GET /v1/templates`` at 100 / 1,000 / 10,000 templates, cold and warm, and the server's
memory.

Synthetic manifests (single mode, ``--layers`` shards of ``--levels`` representations each: about 30 KB at the
defaults, the size of a real single-mode manifest) are validated with ``parse_manifest`` and written with the store's
own writer (``LocalStore.put_manifest``) into a temporary folder store, which grows from one count to the next. For
each count a fresh ``sakura serve --model none`` is started on 127.0.0.1 and timed over HTTP:

- cold: the first listing after start (503s during the first build are retried every 50 ms and counted), and
  meanwhile ``GET /healthz`` every 50 ms (its median and worst latency: does the build hold up other routes);
- warm: the median of ``--repeats`` listings within the catalog's TTL, and one page (``?limit=100``);
- relisted: a listing once the TTL has passed (the store listed again, nothing changed);
- one changed: a listing once the TTL has passed after one manifest was rewritten;
- RSS: the server's resident memory before the first listing and after the last, and its peak (``VmHWM``).

``--compare-with DIR`` runs the same measurements against ``sakura serve`` from another checkout (e.g. an older
revision) on the same store, side by side. Prints a table and writes JSON (``--json``).
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cloud_server.store import LocalStore
from sakura_core.kv.manifest import MANIFEST_VERSION, parse_manifest

__all__ = ["add_arguments", "run", "synthetic_manifest"]

_REPO = Path(__file__).resolve().parents[1]
_TTL_S = 2.0  # ServerConfig.catalog_ttl_s's default, which `sakura serve` uses
_MODEL_ID = "ab" * 32


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, help="write the results here")
    parser.add_argument("--counts", default="100,1000,10000", help="template counts (comma list; default %(default)s)")
    parser.add_argument("--layers", type=int, default=28, help="shards per manifest (default %(default)s)")
    parser.add_argument("--levels", type=int, default=5, help="representations per shard (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="warm listings per count (default %(default)s)")
    parser.add_argument(
        "--compare-with",
        default=None,
        metavar="DIR",
        help="a checkout of this repository whose `sakura serve` is measured too, side by side",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one listing may take (default 900)")


def synthetic_manifest(template_id: str, layers: int, levels: int, salt: str = "") -> dict:
    """A valid single-mode manifest: per shard a progressive ladder (level j requires levels 0..j-1) topped by an
    fp16 representation; digests are hashes of names (no blobs: the catalog never reads shards)."""
    shards = []
    for layer in range(layers):
        reps: list[dict[str, Any]] = []
        chain: list[str] = []
        for level in range(levels):
            top = level == levels - 1
            digest = hashlib.sha256(f"{template_id}/{layer}/{level}/{salt}".encode()).hexdigest()
            size = 4096 * (level + 1) if not top else 65536
            reps.append(
                {
                    "level": level,
                    "name": "fp16" if top else f"sakura-{level}",
                    "codec": "fp16" if top else "sakura",
                    "bytes": size,
                    "total_bytes": size if top else size + sum(r["bytes"] for r in reps),
                    "distortion": 0.0 if top else round(0.1 / (level + 1), 4),
                    "digest": digest,
                    "requires": [] if top else list(chain),
                }
            )
            chain.append(digest)
        shards.append({"layers": [layer, layer], "representations": reps})
    manifest = {
        "version": MANIFEST_VERSION,
        "model_id": _MODEL_ID,
        "template_id": template_id,
        "token_grid": [32, 32],
        "rope_layout": "flux2-ref-t10",
        "num_layers": layers,
        "heads": 24,
        "head_dim": 128,
        "codec": "sakura",
        "distortion_metric": "attn_rel_err",
        "shards": shards,
    }
    parse_manifest(manifest, template_id=template_id)  # the one schema: a bench of invalid manifests measures nothing
    return manifest


def _fill(store: LocalStore, have: int, want: int, args) -> None:
    t0 = time.perf_counter()
    for i in range(have, want):
        tid = f"tpl-{i:05d}"
        store.put_manifest(tid, synthetic_manifest(tid, args.layers, args.levels))
    print(f"  wrote manifests {have}..{want - 1} in {time.perf_counter() - t0:.1f} s", flush=True)


# ---- one server -------------------------------------------------------------------------------------------------
def _serve(store: LocalStore, checkout: Path, log: Path) -> tuple[subprocess.Popen, int]:
    cmd = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "serve",
        "--store",
        str(store.root),
        "--port",
        "0",
        "--model",
        "none",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("SAKURA_TOKEN", "SAKURA_READ_TOKEN")}
    env["PYTHONPATH"] = str(checkout)
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=checkout)
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline().decode()
    if not line.startswith("serving http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError(f"sakura serve ({checkout}) did not start: {line!r} {log.read_text()[-2000:]}")
    return proc, int(line.split()[1].rsplit(":", 1)[1])


def _get(port: int, query: str, timeout_s: float) -> tuple[int, bytes, float]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/templates{query}", timeout=timeout_s) as r:
            return r.status, r.read(), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.perf_counter() - t0


def _rss_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


class _HealthProbe(threading.Thread):
    """``GET /healthz`` every 50 ms while the first listing is built: another route's latency meanwhile."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self._halt = port, threading.Event()
        self.latencies_s: list[float] = []

    def run(self) -> None:
        while not self._halt.wait(0.05):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=60) as r:
                r.read()
            self.latencies_s.append(time.perf_counter() - t0)

    def stop(self) -> None:
        self._halt.set()
        self.join(70)

    def summary(self) -> dict:
        lat = self.latencies_s or [0.0]
        return {
            "healthz_during_cold_p50_s": round(statistics.median(lat), 4),
            "healthz_during_cold_max_s": round(max(lat), 4),
            "healthz_during_cold_n": len(self.latencies_s),
        }


def _listing(port: int, timeout_s: float, n: int) -> float:
    status, body, dt = _get(port, "", timeout_s)
    if status != 200 or len(json.loads(body)["templates"]) != n:
        raise RuntimeError(f"listing: HTTP {status}, {body[:300]!r}")
    return dt


def _measure(name: str, checkout: Path, store: LocalStore, n: int, args, work: Path) -> dict:
    proc, port = _serve(store, checkout, work / f"serve-{name}-{n}.log")
    try:
        rss_start = _rss_kib(proc.pid)["VmRSS"]
        probe = _HealthProbe(port)
        probe.start()
        try:
            t0, refused = time.perf_counter(), 0
            deadline = t0 + args.timeout
            while True:  # bounded by --timeout
                status, body, _ = _get(port, "", args.timeout)
                if status != 503 or time.perf_counter() > deadline:
                    break
                refused += 1
                time.sleep(0.05)
            cold = time.perf_counter() - t0
        finally:
            probe.stop()
        if status != 200 or len(json.loads(body)["templates"]) != n:
            raise RuntimeError(f"{name}: first listing: HTTP {status}, {body[:300]!r}")
        warm = [_listing(port, args.timeout, n) for _ in range(args.repeats)]
        status, page, page_s = _get(port, "?limit=100", args.timeout)
        paged = status == 200 and "next" in json.loads(page)
        time.sleep(_TTL_S + 0.2)
        relisted = _listing(port, args.timeout, n)
        store.put_manifest("tpl-00000", synthetic_manifest("tpl-00000", args.layers, args.levels, f"{name}{n}"))
        time.sleep(_TTL_S + 0.2)
        changed = _listing(port, args.timeout, n)
        rss = _rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    row = {
        "server": name,
        "templates": n,
        "body_bytes": len(body),
        "cold_s": round(cold, 4),
        "cold_503s": refused,
        "warm_s": round(statistics.median(warm), 5),
        "warm_min_s": round(min(warm), 5),
        "page_s": round(page_s, 5) if paged else None,
        "relisted_s": round(relisted, 4),
        "one_changed_s": round(changed, 4),
        **probe.summary(),
        "rss_start_mib": round(rss_start / 1024, 1),
        "rss_mib": round(rss["VmRSS"] / 1024, 1),
        "rss_peak_mib": round(rss["VmHWM"] / 1024, 1),
    }
    print(
        f"  {name:<8} {n:>6} templates: cold {cold:.3f} s, warm {row['warm_s']:.4f} s, relisted "
        f"{relisted:.3f} s, one changed {changed:.3f} s, RSS {row['rss_mib']} MiB",
        flush=True,
    )
    return row


# ---- report -----------------------------------------------------------------------------------------------------
def _print_table(rows: list[dict]) -> None:
    print(
        f"\n{'server':<8} {'templates':>9} {'body MB':>8} {'cold s':>8} {'503s':>5} {'hz max s':>8} {'warm s':>8} "
        f"{'page s':>8} {'relist s':>8} {'1 chg s':>8} {'RSS MiB':>8} {'peak MiB':>8}"
    )
    for r in rows:
        page = "-" if r["page_s"] is None else f"{r['page_s']:.4f}"
        print(
            f"{r['server']:<8} {r['templates']:>9} {r['body_bytes'] / 1e6:>8.2f} {r['cold_s']:>8.3f} "
            f"{r['cold_503s']:>5} {r['healthz_during_cold_max_s']:>8.3f} {r['warm_s']:>8.4f} {page:>8} "
            f"{r['relisted_s']:>8.3f} {r['one_changed_s']:>8.3f} {r['rss_mib']:>8.1f} {r['rss_peak_mib']:>8.1f}"
        )


def run(args) -> int:
    try:
        counts = sorted(int(x) for x in args.counts.split(",") if x.strip())
        if not counts or counts[0] < 1 or min(args.layers, args.levels, args.repeats) < 1:
            raise ValueError("--counts, --layers, --levels and --repeats must be positive")
        if args.levels < 2:
            raise ValueError("--levels must be >= 2 (a ladder and its fp16 top)")
        servers = [("this", _REPO)]
        if args.compare_with:
            other = Path(args.compare_with).resolve()
            if not (other / "cloud_server" / "app.py").is_file():
                raise ValueError(f"--compare-with {other} is not a checkout of this repository (no cloud_server/)")
            servers.append(("compare", other))
    except ValueError as e:
        print(f"sakura bench listing: {e}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sakura-bench-listing-"))
    rows, have = [], 0
    try:
        store = LocalStore(work / "store")
        manifest_bytes = len(json.dumps(synthetic_manifest("tpl-00000", args.layers, args.levels), indent=1))
        for n in counts:
            _fill(store, have, n, args)
            have = n
            rows += [_measure(name, checkout, store, n, args, work) for name, checkout in servers]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "bench": "listing",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]},
        "config": {
            "counts": counts,
            "layers": args.layers,
            "levels": args.levels,
            "manifest_bytes": manifest_bytes,
            "repeats": args.repeats,
            "catalog_ttl_s": _TTL_S,
            "store": "folder (temporary)",
            "servers": {name: str(path) for name, path in servers},
        },
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    _print_table(rows)
    print(f"wrote {args.json}")
    return 0
