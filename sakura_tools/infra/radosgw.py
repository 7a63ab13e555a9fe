"""A single-node Ceph cluster with its RADOS Gateway on 127.0.0.1: a real S3 server for tests and benchmarks.

One monitor, one OSD on ``memstore`` (objects in the OSD's memory, nothing on disk but the mon's small database) and
``radosgw`` (beast frontend), all in foreground processes under ``workdir``, stopped together. cephx is off inside
the cluster (everything binds loopback); S3 requests are signed as usual with one user's generated key pair. No
manager daemon: nothing here needs one (``ceph -s`` then shows no PG statistics, which is expected).

Debian packages: ``apt-get install --no-install-recommends ceph-mon ceph-osd radosgw ceph-common`` (Ceph 16.2).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from .nginx import free_port

__all__ = ["CEPH_BINARIES", "RadosGateway", "RadosGatewayError", "missing_ceph_binaries"]

logger = logging.getLogger(__name__)

CEPH_BINARIES = ("monmaptool", "ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph")
_SBIN = ("/usr/bin", "/usr/sbin")
_CLI_TRIES = 4  # one try + 3 more after 0.5, 1 and 2 s

_CONF = """\
[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{mon_port}
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
mon allow pool size one = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
mon data avail crit = 0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
osd objectstore = memstore
osd crush update on start = false
osd class update on start = false
memstore device bytes = {memstore_bytes}
run dir = {dir}
admin socket = {dir}/$name.asok
log file = {dir}/$name.log
pid file = {dir}/$name.pid
mon data = {dir}/mon
osd data = {dir}/osd
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw data = {dir}/rgw
rgw enable usage log = false
"""


class RadosGatewayError(RuntimeError):
    """The cluster could not start (a binary is missing, a daemon exited, a step timed out); carries the log tail."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def missing_ceph_binaries() -> list[str]:
    """The Ceph programs this module needs that are not installed (empty when it can start a cluster)."""
    return [name for name in CEPH_BINARIES if _which(name) is None]


class RadosGateway:
    """Start (``start()`` or ``with``) and stop a mon + memstore OSD + radosgw on 127.0.0.1.

    Args:
        workdir: folder for the config, the mon's store, sockets and logs (created; removed by nobody).
        memstore_mib: capacity of the in-memory OSD (MiB); memory is used only by what is stored.
        timeout_s: how long each start-up step may take.

    After ``start()``: ``endpoint_url`` (``http://127.0.0.1:PORT``), ``access_key``, ``secret_key``, ``region``;
    ``env()`` gives them as the usual AWS variables; ``timings_s`` how long each step took.
    """

    region = "us-east-1"

    def __init__(self, workdir: str | os.PathLike, *, memstore_mib: int = 2048, timeout_s: float = 120.0):
        missing = missing_ceph_binaries()
        if missing:
            raise RadosGatewayError(
                f"Ceph is not installed (missing {', '.join(missing)}): apt-get install --no-install-recommends "
                "ceph-mon ceph-osd radosgw ceph-common"
            )
        if memstore_mib < 64:
            raise ValueError(f"memstore_mib must be >= 64, got {memstore_mib}")
        self.dir = Path(workdir).resolve()
        self.memstore_mib = memstore_mib
        self.timeout_s = timeout_s
        self.rgw_port = free_port()
        self.access_key = "SAKURA" + secrets.token_hex(7).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.procs: dict[str, subprocess.Popen] = {}
        self.timings_s: dict[str, float] = {}
        self.conf = self.dir / "ceph.conf"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.rgw_port}"

    def env(self) -> dict[str, str]:
        """The S3 endpoint and credentials as the AWS variables boto3 (and ``sakura --store s3://``) read."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
        }

    # ---- start-up -------------------------------------------------------------------------------------------
    def start(self, attempts: int = 2) -> RadosGateway:
        """Start the cluster; a start that fails is stopped and made again from scratch (fresh folders, ports and
        fsid) up to ``attempts`` times in all, each failure logged with its reason; the last one is raised."""
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
                break
            except RadosGatewayError as e:
                self.stop()
                if attempt == attempts:
                    raise
                logger.warning("radosgw start %d of %d failed, starting afresh: %s", attempt, attempts, e)
                self.rgw_port = free_port()
                self.timings_s = {}
            except BaseException:
                self.stop()
                raise
        logger.info("radosgw up at %s in %.1f s (%s)", self.endpoint_url, sum(self.timings_s.values()), self.timings_s)
        return self

    def _start_once(self) -> None:
        self._step("config+mon", self._start_mon)
        self._step("osd", self._start_osd)
        self._step("rgw", self._start_rgw)
        self._step("user", self._create_user)

    def _step(self, name: str, fn) -> None:
        t0 = time.monotonic()
        fn()
        self.timings_s[name] = round(time.monotonic() - t0, 2)

    def _start_mon(self) -> None:
        for sub in ("mon", "osd", "rgw"):  # a fresh cluster every start
            shutil.rmtree(self.dir / sub, ignore_errors=True)
            (self.dir / sub).mkdir(parents=True)
        fsid = str(uuid.uuid4())
        mon_port = free_port()
        self.conf.write_text(
            _CONF.format(
                fsid=fsid,
                mon_port=mon_port,
                rgw_port=self.rgw_port,
                dir=self.dir,
                memstore_bytes=self.memstore_mib * 2**20,
            )
        )
        monmap = self.dir / "monmap"
        self._run(
            "monmaptool",
            "--create",
            "--clobber",
            "--add",
            "a",
            f"v1:127.0.0.1:{mon_port}",
            "--fsid",
            fsid,
            str(monmap),
        )
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap))
        self._spawn("mon", "ceph-mon", "-f", "-i", "a")

    def _start_osd(self) -> None:
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", "--connect-timeout", str(int(self.timeout_s)), "osd", "new", osd_uuid).strip()
        self._run("ceph-osd", "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        self._run("ceph", "osd", "crush", "add-bucket", "localhost", "host")
        self._run("ceph", "osd", "crush", "move", "localhost", "root=default")
        self._run("ceph", "osd", "crush", "add", f"osd.{osd_id}", "1.0", "host=localhost")
        self._spawn("osd", "ceph-osd", "-f", "-i", osd_id)
        self._wait(
            lambda: json.loads(self._run("ceph", "osd", "dump", "--format", "json"))["osds"][0]["up"] == 1,
            "the OSD to come up",
            "osd",
        )

    def _start_rgw(self) -> None:
        self._spawn("rgw", "radosgw", "-f", "-n", "client.rgw")

        def answers() -> bool:
            try:
                with urllib.request.urlopen(self.endpoint_url, timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False

        self._wait(answers, f"radosgw to answer on {self.endpoint_url}", "rgw")

    def _create_user(self) -> None:
        self._run(
            "radosgw-admin",
            "-n",
            "client.admin",
            "user",
            "create",
            "--uid",
            "sakura",
            "--display-name",
            "sakura tests",
            "--access-key",
            self.access_key,
            "--secret",
            self.secret_key,
        )

    # ---- processes ------------------------------------------------------------------------------------------
    def _argv(self, prog: str, *args: str) -> list[str]:
        return [_which(prog) or prog, "-c", str(self.conf), *args]

    def _run(self, prog: str, *args: str) -> str:
        """Run one Ceph program to completion; its stdout. A ``ceph`` CLI command (idempotent: ``osd new`` with
        the same uuid, ``crush add`` / ``move`` / ``add-bucket`` of what exists succeed again) that fails is tried
        again up to ``_CLI_TRIES`` times in all: a fresh monitor may refuse one now and then (EPERM getting the
        command descriptions). The last failure carries the monitor's log tail."""
        tries = _CLI_TRIES if prog == "ceph" else 1
        for attempt in range(1, tries + 1):
            try:
                out = subprocess.run(
                    self._argv(prog, *args),
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    stdin=subprocess.DEVNULL,
                    cwd=self.dir,
                )
            except subprocess.TimeoutExpired as e:
                raise RadosGatewayError(f"{prog} {' '.join(args[:3])} timed out after {self.timeout_s} s") from e
            if out.returncode == 0:
                return out.stdout
            failure = f"{prog} {' '.join(args)} failed ({out.returncode}): {out.stderr[-2000:]}"
            if attempt < tries:
                logger.warning("%s; trying again (%d of %d)", failure.strip(), attempt + 1, tries)
                time.sleep(0.5 * 2 ** (attempt - 1))
        raise RadosGatewayError(f"{failure}\n{self.log_tail('mon')}")

    def _spawn(self, name: str, prog: str, *args: str) -> None:
        with open(self.dir / f"{name}.out", "wb") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(
                self._argv(prog, *args), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
            )

    def log_tail(self, name: str, chars: int = 2000) -> str:
        parts = []
        for path in (self.dir / f"{name}.out", *self.dir.glob(f"*{name}*.log")):
            if path.is_file():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def _wait(self, ready, what: str, proc_name: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            proc = self.procs[proc_name]
            if proc.poll() is not None:
                raise RadosGatewayError(f"{proc_name} exited with {proc.returncode}:\n{self.log_tail(proc_name)}")
            try:
                if ready():
                    return
            except (RadosGatewayError, ValueError, KeyError, IndexError):
                pass
            time.sleep(0.25)
        raise RadosGatewayError(f"timed out after {self.timeout_s} s waiting for {what}:\n{self.log_tail(proc_name)}")

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop rgw, the OSD and the mon (SIGTERM, then SIGKILL); the OSD's objects are gone with it."""
        for name in ("rgw", "osd", "mon"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", name, proc.pid, timeout_s)
                proc.kill()
                proc.wait(timeout_s)

    def __enter__(self) -> RadosGateway:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
