"""``sakura serve`` under floods (issue 28 point 3), as a real process with RLIMIT_NOFILE 512: 600 idle connections
leave it answering within a minute (the keep-alive timeout, armed when a connection opens, closes idle ones; the
connection cap keeps accept() from running out of descriptors) with a bounded log; malformed requests are logged as
one line per kind per interval, without tracebacks."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from cloud_server.store import LocalStore

from ..synthetic_templates import make_synthetic_template
from .conftest import MODEL_ID

logger = logging.getLogger(__name__)

FD_LIMIT = 512
IDLE = 600
IDLE_TIMEOUT_S = 3
LAUNCH = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
    "from sakura_core.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.fixture
def served(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    argv = [
        sys.executable,
        "-c",
        LAUNCH.format(n=FD_LIMIT),
        "serve",
        "--store",
        str(store.root),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        "none",
        "--idle-timeout",
        str(IDLE_TIMEOUT_S),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log)
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("serving http://127.0.0.1:"), line
        yield int(line.split()[1].rsplit(":", 1)[1]), tmp_path / "serve.log"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _healthz(port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def test_idle_connections_at_a_low_fd_limit_leave_it_answering_with_a_bounded_log(served):
    port, log_path = served
    idle = []
    t0 = time.monotonic()
    try:
        for _ in range(IDLE):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        assert len(idle) >= FD_LIMIT  # the flood reached past the server's descriptors
        answered_s = None
        while time.monotonic() - t0 < 60:
            if _healthz(port):
                answered_s = time.monotonic() - t0
                break
            time.sleep(0.5)
    finally:
        for s in idle:
            s.close()
    log_bytes = os.path.getsize(log_path)
    logger.info(
        "%d idle connections at RLIMIT_NOFILE %d: answered after %s s, log %d bytes",
        len(idle),
        FD_LIMIT,
        answered_s,
        log_bytes,
    )
    assert answered_s is not None, f"no answer within 60 s; log: {log_path.read_text()[-2000:]}"
    assert log_bytes < 20_000 and "Traceback" not in log_path.read_text()


def test_malformed_requests_are_one_line_per_kind_without_tracebacks(served):
    port, log_path = served
    for i in range(200):
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(
                b"\x16\x03\x01 NOT HTTP\r\n\r\n" if i % 2 else b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"
            )
            try:
                s.recv(256)
            except OSError:
                pass
    assert _healthz(port)
    text = log_path.read_text()
    logger.info("200 malformed requests: log %d bytes:\n%s", len(text), text)
    assert "Traceback" not in text and len(text) < 2_000
    assert text.count("refused a connection: malformed request") <= 2
