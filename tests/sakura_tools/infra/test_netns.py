"""Kernel shaping in a network namespace we create (root only; skipped with the reason otherwise).

``ip`` and ``tc`` (Debian's iproute2) are installed by CI: with ``CI=true`` their absence fails. Root and a kernel
that lets us create namespaces cannot be installed: without them the tests skip, in CI too, with the reason.
"""

import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from ci_deps import require_or_skip

from sakura_tools.infra.netns import NetnsConfig, NetnsLink, netns_available

require_or_skip(
    os.geteuid() != 0 or all(shutil.which(tool) for tool in ("ip", "tc")),  # without root: netns_available's skip
    "`ip`/`tc` not found (Debian package iproute2; .ci/run installs it)",
    allow_module_level=True,
)
OK, WHY = netns_available()
pytestmark = [pytest.mark.root, pytest.mark.skipif(not OK, reason=f"kernel shaping unavailable: {WHY}")]

SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"x" * int(self.path.strip("/"))
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer((sys.argv[1], 8765), H).handle_request()
"""


def _fetch_rate(link, nbytes):
    proc = subprocess.Popen(link.exec_argv([sys.executable, "-c", SERVER, link.ns_ip]))
    try:
        for _ in range(50):  # wait (bounded) for the server to listen
            try:
                t0 = time.monotonic()
                data = urllib.request.urlopen(f"http://{link.ns_ip}:8765/{nbytes}", timeout=30).read()
                return len(data) / (time.monotonic() - t0)
            except OSError:
                time.sleep(0.1)
        raise AssertionError("server in the namespace never answered")
    finally:
        proc.wait(timeout=30)


def test_tbf_in_a_namespace_limits_the_download_rate():
    with NetnsLink(NetnsConfig(subnet_index=201)) as link:
        link.set_rate(2e6 / 8)  # 2 Mbit/s
        rate = _fetch_rate(link, 500_000)
        # shaped: far below an unshaped veth (Gbit/s), and of the order of the set rate
        assert 0.3 * 2e6 / 8 < rate < 2.0 * 2e6 / 8, rate
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert link.name not in out  # cleaned up
