"""Real kernel link shaping for the live benchmark: a network namespace + veth pair + ``tc qdisc tbf``.

The server runs inside the namespace (``exec_argv``); the client stays in the host namespace and reaches it at
``ns_ip``. The namespace side's egress (server -> phone, the download direction) goes through a token bucket
filter whose rate ``follow()`` changes as the trace advances. netem is not compiled into these kernels, so
latency is added in user space by the client. Needs root; ``available()`` says why not otherwise.

Only addresses inside the namespace pair this module creates are used (a /30 of 10.203.0.0/16 by default).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from sakura_core.fetch.traces import Trace

__all__ = ["NetnsLink", "NetnsConfig", "netns_available"]

logger = logging.getLogger(__name__)

_MIN_RATE_KBIT = 8  # tbf needs a positive rate; zero-rate trace segments become 8 kbit/s


def netns_available() -> tuple[bool, str]:
    """(True, "") when namespaces can be created here, else (False, the reason)."""
    if os.geteuid() != 0:
        return False, "kernel shaping needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` not found (Debian package iproute2)"
    probe = f"sakura-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


@dataclass(frozen=True)
class NetnsConfig:
    """Attributes:
    subnet_index: picks the /30 10.203.<index>.0 (0..255), so parallel links do not collide.
    burst_bytes: tbf bucket depth.
    queue_latency_ms: tbf queue limit expressed as latency.
    update_s: shortest interval between two rate changes when following a trace.
    """

    subnet_index: int = 0
    burst_bytes: int = 32 * 1024
    queue_latency_ms: int = 400
    update_s: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.subnet_index <= 255:
            raise ValueError(f"subnet_index must be in 0..255, got {self.subnet_index}")
        if self.update_s <= 0:
            raise ValueError(f"update_s must be > 0, got {self.update_s}")


class NetnsLink:
    """``with NetnsLink() as link:`` creates the namespace and veth pair; leaving removes them (also on errors)."""

    def __init__(self, config: NetnsConfig | None = None):
        self.config = config or NetnsConfig()
        tag = f"{os.getpid() % 100000}x{self.config.subnet_index}"
        self.name = f"sakura-{tag}"
        self.host_dev, self.ns_dev = f"sk{tag}h"[:15], f"sk{tag}n"[:15]
        self.host_ip = f"10.203.{self.config.subnet_index}.1"
        self.ns_ip = f"10.203.{self.config.subnet_index}.2"
        self._up = False

    def _run(self, *argv: str) -> None:
        r = subprocess.run(list(argv), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed: {r.stderr.strip()}")

    def _ns(self, *argv: str) -> None:
        self._run("ip", "netns", "exec", self.name, *argv)

    def __enter__(self) -> NetnsLink:
        ok, why = netns_available()
        if not ok:
            raise RuntimeError(why)
        try:
            self._run("ip", "netns", "add", self.name)
            self._up = True
            self._run("ip", "link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev)
            self._run("ip", "link", "set", self.ns_dev, "netns", self.name)
            self._run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_dev)
            self._run("ip", "link", "set", self.host_dev, "up")
            self._ns("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_dev)
            self._ns("ip", "link", "set", self.ns_dev, "up")
            self._ns("ip", "link", "set", "lo", "up")
            self._ns(*self._tbf("add", 100_000))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._up:
            subprocess.run(["ip", "link", "del", self.host_dev], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
            self._up = False

    def _tbf(self, verb: str, rate_kbit: float) -> list[str]:
        c = self.config
        rate = max(_MIN_RATE_KBIT, int(rate_kbit))
        return [
            "tc",
            "qdisc",
            verb,
            "dev",
            self.ns_dev,
            "root",
            "tbf",
            "rate",
            f"{rate}kbit",
            "burst",
            str(c.burst_bytes),
            "latency",
            f"{c.queue_latency_ms}ms",
        ]

    def set_rate(self, bytes_per_s: float) -> None:
        """Change the download rate now."""
        self._ns(*self._tbf("change", bytes_per_s * 8 / 1000))

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    async def follow(self, trace: Trace, start_offset_s: float = 0.0, stop: asyncio.Event | None = None) -> None:
        """Set the rate from ``trace`` as time passes (until ``stop`` is set or the task is cancelled)."""
        t0 = time.monotonic()
        last = None
        while stop is None or not stop.is_set():
            t = start_offset_s + time.monotonic() - t0
            rate = trace.rate_at(t)
            if rate != last:
                await asyncio.to_thread(self.set_rate, rate)
                last = rate
            await asyncio.sleep(self.config.update_s)
