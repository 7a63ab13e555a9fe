"""A local nginx on loopback: the CDN tier in front of the server (``proxy_cache``), or a static shard server.

Used by the CDN-tier test and by ``sakura bench serve`` (nginx serving the same files side by side). The config
mirrors what a CDN does with the server's headers: shards are cached for as long as their ``Cache-Control`` says
(a year, immutable), manifests and catalogs are revalidated. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from sakura_core.fetch.store_layout import SHARDS_DIR

__all__ = ["NginxError", "NginxProcess", "find_nginx", "free_port"]

logger = logging.getLogger(__name__)


class NginxError(RuntimeError):
    """nginx is missing or did not start; the message carries its error log."""


def find_nginx() -> str | None:
    """Path of the nginx binary (``PATH`` or ``/usr/sbin``), or ``None``."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_COMMON = """\
worker_processes {workers};
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_rlimit_nofile 16384;
{user}
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy_temp;
    fastcgi_temp_path {dir}/fastcgi_temp;
    uwsgi_temp_path {dir}/uwsgi_temp;
    scgi_temp_path {dir}/scgi_temp;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 65;
    types {{ }}
    default_type application/octet-stream;
{body}
}}
"""

_PROXY = """\
    proxy_cache_path {dir}/cache levels=1:2 keys_zone=sakura_shards:10m max_size={cache_mib}m inactive=7d
                     use_temp_path=off;
    upstream sakura {{
{upstream_servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /v1/shards/ {{
            proxy_pass http://sakura;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache sakura_shards;
            proxy_cache_lock on;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
        location / {{
            proxy_pass http://sakura;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            add_header X-Cache-Status $upstream_cache_status always;
        }}
    }}
"""

_STATIC = """\
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location ~ "^/v1/shards/(?<aa>[0-9a-f]{{2}})(?<rest>[0-9a-f]{{62}})$" {{
            alias {store}/{shards_dir}/$aa/$aa$rest;
            add_header Cache-Control "public, max-age=31536000, immutable";
        }}
    }}
"""


class NginxProcess:
    """Run nginx in the foreground with a config written to ``workdir``; a context manager.

    Exactly one of ``upstream_port`` (reverse proxy with ``proxy_cache``: the CDN stand-in; a list of ports
    balances round-robin over several ``sakura serve`` replicas) and ``static_store`` (serve
    ``STORE/shards/<aa>/<digest>`` at ``/v1/shards/<digest>`` directly) is given.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        upstream_port: int | list[int] | None = None,
        static_store: str | os.PathLike | None = None,
        workers: int = 1,
        cache_mib: int = 1024,
        port: int | None = None,
    ):
        if (upstream_port is None) == (static_store is None):
            raise ValueError("give exactly one of upstream_port (proxy cache) or static_store (static files)")
        binary = find_nginx()
        if binary is None:
            raise NginxError("nginx is not installed (Debian: apt-get install nginx-light)")
        self.binary: str = binary
        self.dir = Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        ports = [upstream_port] if isinstance(upstream_port, int) else list(upstream_port or [])
        fields = dict(
            dir=self.dir,
            port=self.port,
            upstream_servers="\n".join(f"        server 127.0.0.1:{p};" for p in ports),
            store=Path(static_store).resolve() if static_store else None,
            shards_dir=SHARDS_DIR,  # the store layout (sakura_core.fetch.store_layout)
            cache_mib=cache_mib,
        )
        body = (_PROXY if upstream_port is not None else _STATIC).format(**fields)
        # As root, nginx switches workers to 'nobody', who cannot read a private temp folder: keep root there.
        user = "user root;" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
        self.conf = self.dir / "nginx.conf"
        self.conf.write_text(_COMMON.format(workers=workers, dir=self.dir, user=user, body=body))
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        path = self.dir / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def start(self, timeout_s: float = 10.0) -> NginxProcess:
        cmd = [self.binary, "-p", str(self.dir), "-c", str(self.conf), "-e", str(self.dir / "error.log")]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise NginxError(f"nginx exited with {self.proc.returncode}: {err}{self.error_log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise NginxError(f"nginx did not listen on 127.0.0.1:{self.port} within {timeout_s} s: {self.error_log()}")

    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def worker_pids(self) -> list[int]:
        """Pids of the worker processes (children of the master), from /proc."""
        if self.proc is None:
            return []
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    pids.append(int(entry))
        return pids

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGQUIT)  # graceful: finish in-flight requests
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("nginx %d did not stop on SIGQUIT within %.0f s; killing it", self.proc.pid, timeout_s)
            self.proc.kill()
            self.proc.wait(timeout_s)
        if self.proc.stderr:
            self.proc.stderr.close()

    def __enter__(self) -> NginxProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
