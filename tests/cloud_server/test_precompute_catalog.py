"""``sakura precompute-catalog`` on a local Ray cluster (head + 2 workers, started here) into a bucket of a real
radosgw: a 6-entry catalog (both KV modes) is published, a re-run is a no-op, two concurrent drivers asking for one
entry precompute it once, and a worker killed with -9 mid-publish is retried without a half-published template.
Also the catalog format's errors, and the local ``--workers`` pool."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cloud_server.catalog import CatalogError, load_catalog
from sakura_core.kv.manifest import manifest_kv_mode

from ..synthetic_templates import make_synthetic_template

pytestmark = pytest.mark.slow

RAY_PORT_BASE = 46000


def _catalog(path: Path, templates: list[tuple[str, str]], kv_modes=("single",), steps: int = 2) -> Path:
    spec = {
        "version": 1,
        "templates": [{"name": n, "image": i} for n, i in templates],
        "models": {"demo": "demo"},
        "kv_modes": list(kv_modes),
        "schedules": [{"steps": steps, "shift": 1.0}],
    }
    path.write_text(json.dumps(spec))
    return path


class _RayCluster:
    """``ray start --head`` (no CPUs: it only hosts the coordinator) and two ``ray start --address`` nodes with one
    CPU each, on 127.0.0.1, each in its own process group so teardown stops exactly what it started."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        self.port = RAY_PORT_BASE + os.getpid() % 1000
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.ray = str(Path(sys.executable).with_name("ray"))

    def _start(self, *args: str, ready_s: float = 180) -> None:
        log = open(Path(self.tmp) / f"node{len(self.procs)}.log", "wb")  # noqa: SIM115 - the child keeps it
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        proc = subprocess.Popen(
            [
                self.ray,
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                "--object-store-memory=80000000",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + ready_s
        path = Path(log.name)
        while time.monotonic() < deadline:
            text = path.read_text(errors="replace")
            if "will now block forever" in text:
                return
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.5)
        raise RuntimeError(f"ray start {' '.join(args)} not ready in {ready_s} s:\n{path.read_text()[-3000:]}")

    def start(self) -> "_RayCluster":
        self._start(
            "--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={self.tmp}"
        )
        for _ in range(2):  # one at a time: two raylets registering at once time out on a busy 2-core machine
            self._start(f"--address={self.address}", "--num-cpus=1")
        return self

    def process_groups(self) -> set[int]:
        return {p.pid for p in self.procs}

    def task_pids(self, name: str = "ray::run_entry") -> list[int]:
        """Worker processes of this cluster now running a catalog task (by process title, and descending from one
        of the ``ray start`` processes started here: raylets put their workers in process groups of their own)."""
        roots = {p.pid for p in self.procs}
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if cmdline.startswith(name.encode()) and self._descends(int(entry), roots):
                    pids.append(int(entry))
        return pids

    @staticmethod
    def _descends(pid: int, roots: set[int]) -> bool:
        for _ in range(32):  # bounded walk up the parent chain
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return False
            pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            if pid in roots:
                return True
            if pid <= 1:
                return False
        return False

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):  # the raylets' workers exit with them
            for proc in reversed(self.procs):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    continue
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(self._group_alive(p.pid) for p in self.procs):
                time.sleep(0.25)
        for proc in self.procs:
            proc.wait(5)
        shutil.rmtree(self.tmp, ignore_errors=True)

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.fixture(scope="module")
def ray_cluster(radosgw, skip_or_fail):
    try:
        import ray  # noqa: F401
    except ImportError:
        skip_or_fail("precompute on Ray needs ray (pip install 'sakura-kv[cloud]'): Ray catalog tests skipped")
    cluster = _RayCluster()
    try:
        cluster.start()
    except RuntimeError as e:
        cluster.stop()
        skip_or_fail(f"the local Ray cluster did not start: {e}")
    yield cluster
    cluster.stop()


async def _driver(catalog: Path, store, endpoint: str, *extra: str):
    argv = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "precompute-catalog",
        str(catalog),
        "--store",
        str(store.location),
        "--s3-endpoint",
        endpoint,
        *extra,
    ]
    return await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )


async def _finish(proc, timeout_s: float = 600) -> tuple[int, str]:
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    return proc.returncode, out.decode()


async def _until_line(proc, needle: bytes, timeout_s: float = 300) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while needle not in seen:
        line = await asyncio.wait_for(proc.stdout.readline(), max(1.0, deadline - time.monotonic()))
        if not line:
            raise AssertionError(f"driver ended before printing {needle!r}:\n{seen.decode()}")
        seen += line
    return seen


def _results(path: Path) -> dict[str, dict]:
    return {r["template_id"]: r for r in json.loads(path.read_text())["results"]}


async def test_a_six_entry_catalog_on_ray_then_a_rerun_is_a_no_op(ray_cluster, radosgw, s3_gate, tmp_path, sakura_cli):
    from cloud_server.s3_store import S3Store

    store = S3Store(f"s3://sakura-tests/catalog-{os.getpid()}", endpoint_url=radosgw.endpoint_url)
    templates = [("face", "astronaut"), ("cup", "coffee"), ("cat", "chelsea")]
    catalog = _catalog(tmp_path / "catalog.json", templates, kv_modes=("single", "per-step"))
    rc, out = await _finish(
        await _driver(catalog, store, s3_gate.url, "--ray", ray_cluster.address, "--json", str(tmp_path / "run1.json"))
    )
    assert rc == 0, out
    assert "6 entries, 0 already published, 6 to precompute" in out and "[6/6]" in out, out
    results = _results(tmp_path / "run1.json")
    ids = sorted(f"{n}-demo-{m}" for n, _ in templates for m in ("single", "ps2"))
    assert sorted(results) == ids and all(r["status"] == "published" for r in results.values())
    assert len({r["pid"] for r in results.values()}) >= 2  # both worker nodes ran entries
    assert store.list_templates() == ids
    for tid in ids:
        manifest = store.get_manifest(tid)
        assert manifest_kv_mode(manifest) == ("per-step" if tid.endswith("ps2") else "single")
        assert manifest["precompute"]["catalog_entry"] == results[tid]["key"]
    puts = [p for m, p in s3_gate.seen if m == "PUT"]
    rc, out = await _finish(await _driver(catalog, store, s3_gate.url, "--ray", ray_cluster.address))
    assert rc == 0 and "6 already published, 0 to precompute" in out, out
    assert [p for m, p in s3_gate.seen if m == "PUT"] == puts  # nothing written again
    args = ["--store", str(store.location), "--s3-endpoint", radosgw.endpoint_url, "--orphan-age-s", "0"]
    rc, out = await sakura_cli("store", "verify", *args)
    assert rc == 0 and out.strip().endswith("clean"), out


async def test_two_drivers_asking_for_one_entry_precompute_it_once(ray_cluster, radosgw, s3_gate, tmp_path):
    from cloud_server.s3_store import S3Store

    store = S3Store(f"s3://sakura-tests/coalesce-{os.getpid()}", endpoint_url=radosgw.endpoint_url)
    catalog = _catalog(tmp_path / "one.json", [("rocket", "rocket")])
    hold = s3_gate.hold("PUT", r"/templates/rocket-demo-single/manifest\.json$")
    # the hold outlasts the S3 client's default 10 s read timeout on a loaded machine, and a retried PUT passes the
    # gate: the workers get a read timeout longer than the hold, so the held PUT is the only one
    patient = ("--s3-read-timeout", "300", "--s3-attempts", "1")
    first = await _driver(
        catalog, store, s3_gate.url, "--ray", ray_cluster.address, "--json", str(tmp_path / "a.json"), *patient
    )
    await asyncio.wait_for(hold.arrived.wait(), 300)  # the first driver's task is publishing (manifest held)
    second = await _driver(
        catalog, store, s3_gate.url, "--ray", ray_cluster.address, "--json", str(tmp_path / "b.json"), *patient
    )
    seen = await _until_line(second, b"submitted to the coordinator")
    assert b"0 already published, 1 to precompute" in seen, seen
    await asyncio.sleep(2.0)  # the second request reaches the coordinator while the first is in flight
    hold.release()
    (rc1, out1), (rc2, out2) = await _finish(first), await _finish(second)
    assert rc1 == 0 and rc2 == 0, (out1, out2)
    a, b = _results(tmp_path / "a.json")["rocket-demo-single"], _results(tmp_path / "b.json")["rocket-demo-single"]
    assert a["status"] == b["status"] == "published"
    assert a["run_id"] == b["run_id"]  # one precompute; both drivers got its result
    assert not a["coalesced"] and b["coalesced"]
    manifest_puts = [p for m, p in s3_gate.seen if m == "PUT" and p.endswith("rocket-demo-single/manifest.json")]
    assert len(manifest_puts) == 1, manifest_puts


async def test_a_worker_killed_mid_publish_is_retried_without_a_half_published_template(
    ray_cluster, radosgw, s3_gate, tmp_path, sakura_cli
):
    from cloud_server.s3_store import S3Store

    store = S3Store(f"s3://sakura-tests/kill-{os.getpid()}", endpoint_url=radosgw.endpoint_url)
    make_synthetic_template(store, "swap-demo-single", model_id="ab" * 32)  # an older version of the entry
    old = store.get_manifest_bytes("swap-demo-single")
    v2 = _catalog(tmp_path / "v2.json", [("swap", "coffee")])  # its key is not the published one: republished
    hold = s3_gate.hold("PUT", r"/templates/swap-demo-single/manifest\.json$")
    driver = await _driver(v2, store, s3_gate.url, "--ray", ray_cluster.address, "--json", str(tmp_path / "r.json"))
    await asyncio.wait_for(hold.arrived.wait(), 300)
    pids = ray_cluster.task_pids()
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    hold.release(forward=False)  # the dead worker's manifest PUT never lands
    assert store.get_manifest_bytes("swap-demo-single") == old  # readers still get the old template, whole
    rc, out = await _finish(driver)
    assert rc == 0, out
    result = _results(tmp_path / "r.json")["swap-demo-single"]
    assert result["status"] == "published" and result["pid"] != pids[0]  # Ray retried it on a new worker
    new = store.get_manifest("swap-demo-single")
    assert new["precompute"]["catalog_entry"] == result["key"] and new != json.loads(old)
    args = ["--store", str(store.location), "--s3-endpoint", radosgw.endpoint_url, "--orphan-age-s", "0"]
    rc, out = await sakura_cli("store", "repair", *args)  # the old version's shards are orphans now
    assert rc == 0, out
    rc, out = await sakura_cli("store", "verify", *args)
    assert rc == 0 and out.strip().endswith("clean"), out


def test_catalog_errors_name_the_field(tmp_path):
    bad = tmp_path / "c.json"
    cases = [
        ({"version": 2}, "version"),
        ({"version": 1, "templates": [], "models": {"d": "demo"}}, "templates"),
        ({"version": 1, "templates": [{"name": "a", "image": "astronaut"}], "models": {"d": "sd15"}}, "unknown model"),
        ({"version": 1, "templates": [{"name": "a", "image": "nope.png"}], "models": {"d": "demo"}}, "nope.png"),
        ({"version": 1, "templates": [{"name": "A!", "image": "astronaut"}], "models": {"d": "demo"}}, "entry id"),
        ({"version": 1, "templates": [{"name": "a", "image": "astronaut"}] * 2, "models": {"d": "demo"}}, "repeat"),
        (
            {
                "version": 1,
                "templates": [{"name": "a", "image": "astronaut"}],
                "models": {"d": "demo"},
                "kv_modes": ["joint"],
            },
            "kv_modes",
        ),
    ]
    for spec, message in cases:
        bad.write_text(json.dumps(spec))
        with pytest.raises(CatalogError, match=message):
            load_catalog(bad)


def test_entry_keys_follow_what_the_kv_depends_on(tmp_path):
    path = _catalog(tmp_path / "c.json", [("a", "astronaut")], kv_modes=("single", "per-step"))
    base = {e.template_id: e.key for e in load_catalog(path)}
    assert base == {e.template_id: e.key for e in load_catalog(path)}  # stable
    assert set(base) == {"a-demo-single", "a-demo-ps2"}
    bf16 = {e.template_id: e.key for e in load_catalog(path, dtype="bfloat16")}
    assert all(bf16[k] != base[k] for k in base)  # the dtype is part of the model
    other = {e.template_id: e.key for e in load_catalog(_catalog(tmp_path / "d.json", [("a", "coffee")]))}
    assert other["a-demo-single"] != base["a-demo-single"]
    three = {
        e.template_id: e.key
        for e in load_catalog(
            _catalog(tmp_path / "e.json", [("a", "astronaut")], kv_modes=("single", "per-step"), steps=3)
        )
    }
    assert three["a-demo-single"] == base["a-demo-single"]  # single-mode KV fits any schedule
    assert "a-demo-ps3" in three


def test_entries_take_the_serving_profile_unless_the_catalog_or_the_command_says_full(tmp_path):
    path = _catalog(tmp_path / "c.json", [("a", "astronaut")])
    serving = load_catalog(path)
    assert [e.store_profile for e in serving] == ["serving"]
    full = load_catalog(path, store_profile="full")
    assert [e.store_profile for e in full] == ["full"] and full[0].key != serving[0].key  # republished when changed
    spec = {**json.loads(path.read_text()), "store_profile": "full"}
    path.write_text(json.dumps(spec))
    assert [e.key for e in load_catalog(path)] == [full[0].key]
    path.write_text(json.dumps({**spec, "store_profile": "fp16"}))
    with pytest.raises(CatalogError, match="'store_profile' must be one of serving, full"):
        load_catalog(path)


def test_local_workers_publish_and_coalesce_duplicates(tmp_path):
    from cloud_server.catalog_jobs import LocalRunner, make_job
    from cloud_server.store import LocalStore

    entries = load_catalog(_catalog(tmp_path / "c.json", [("a", "astronaut")]))
    store_dir = str(tmp_path / "store")
    job = make_job(entries[0], store_dir, None, "cpu", None)
    seen = []
    results = LocalRunner(2, threads=1, progress=seen.append).run([job, job])
    assert len(seen) == 1 and results[0] is results[1] and results[0]["status"] == "published"
    assert LocalStore(store_dir).list_templates() == ["a-demo-single"]
    manifest = LocalStore(store_dir).get_manifest("a-demo-single")
    assert manifest["store_profile"] == "serving"  # a catalog publishes the serving profile by default
    assert not any(r["name"] == "fp16" for sh in manifest["shards"] for r in sh["representations"])
    again = LocalRunner(1, threads=1).run([job])
    assert again[0]["status"] == "skipped"


def test_a_job_carries_the_drivers_s3_limits_to_its_worker(tmp_path, monkeypatch):
    from cloud_server import catalog_jobs
    from cloud_server.s3_io import S3Config

    entry = load_catalog(_catalog(tmp_path / "c.json", [("a", "astronaut")]))[0]
    limits = S3Config(connect_timeout_s=3.0, read_timeout_s=300.0, max_attempts=1)
    job = json.loads(
        json.dumps(catalog_jobs.make_job(entry, "s3://b/p", "http://127.0.0.1:9", "cpu", None, s3_config=limits))
    )
    opened = {}

    def open_store(location, *, endpoint_url=None, s3_config=None):
        opened.update(location=location, s3_config=s3_config)
        raise RuntimeError("stop here")

    monkeypatch.setattr(catalog_jobs, "open_store", open_store)
    with pytest.raises(RuntimeError, match="stop here"):
        catalog_jobs.run_entry(job)
    assert opened == {"location": "s3://b/p", "s3_config": limits}


def test_precompute_catalog_refuses_a_bad_s3_limit_by_name(tmp_path, capsys):
    from sakura_core.cli import main

    path = _catalog(tmp_path / "c.json", [("a", "astronaut")])
    assert main(["precompute-catalog", str(path), "--store", "s3://b/p", "--s3-read-timeout", "0"]) == 2
    assert "read_timeout" in capsys.readouterr().err
