"""The load generator of ``sakura bench serve`` and ``sakura bench catalog``: bounded concurrent loopback clients and per-process RSS/CPU
probes (read from /proc)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import resource
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["cpu_s", "load", "rss_bytes"]

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = resource.getpagesize()


# ---- process probes -------------------------------------------------------------------------------------------
def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime
        except (OSError, IndexError, ValueError):
            continue
    return total


# ---- load generator -------------------------------------------------------------------------------------------
@dataclass
class _Run:
    latencies_s: list[float] = field(default_factory=list)
    connect_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    next_request: int = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def _connect(loop, port: int, run: _Run, timeout_s: float) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), timeout_s)
    except (OSError, asyncio.TimeoutError) as e:
        sock.close()
        run.error(f"connect:{type(e).__name__}")
        return None
    run.connect_s.append(time.perf_counter() - t0)
    return sock


async def _request(loop, sock, req: bytes, buf: bytearray, mv: memoryview) -> tuple[int, int, int]:
    """Send one GET, read the response into ``buf``; returns (status, body offset, body length)."""
    await loop.sock_sendall(sock, req)
    n, end = 0, -1
    while end < 0:
        r = await loop.sock_recv_into(sock, mv[n:])
        if r == 0:
            raise ConnectionResetError("server closed the connection")
        n += r
        end = buf.find(b"\r\n\r\n", 0, n)
    head = bytes(buf[:end]).split(b"\r\n")
    status = int(head[0].split()[1])
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    total = end + 4 + length
    if total > len(buf):
        raise ValueError(f"response of {length} bytes is larger than any shard")
    while n < total:
        r = await loop.sock_recv_into(sock, mv[n:total])
        if r == 0:
            raise ConnectionResetError("body truncated")
        n += r
    return status, end + 4, length


async def _client(port, reqs, sizes, digests, order, run: _Run, timeout_s: float, verify_every: int, buf_bytes: int):
    loop = asyncio.get_running_loop()
    sock = await _connect(loop, port, run, timeout_s)
    if sock is None:
        return
    buf = bytearray(buf_bytes)
    mv = memoryview(buf)
    try:
        while run.next_request < len(order):
            i = run.next_request
            run.next_request += 1
            k = order[i]
            t0 = time.perf_counter()
            try:
                status, off, length = await asyncio.wait_for(_request(loop, sock, reqs[k], buf, mv), timeout_s)
            except (OSError, ValueError, IndexError, asyncio.TimeoutError) as e:
                run.error(f"request:{type(e).__name__}")
                sock.close()
                sock = await _connect(loop, port, run, timeout_s)
                if sock is None:
                    return
                continue
            run.latencies_s.append(time.perf_counter() - t0)
            if status != 200:
                run.error(f"status:{status}")
            elif length != sizes[k]:
                run.error("wrong-size")
            elif i % verify_every == 0 and hashlib.sha256(mv[off : off + length]).hexdigest() != digests[k]:
                run.error("wrong-digest")
            else:
                run.bytes += length
    finally:
        if sock is not None:
            sock.close()


async def load(port, digests, sizes, conns, n_requests, seed, timeout_s) -> tuple[_Run, float]:
    reqs = [f"GET /v1/shards/{d} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() for d in digests]
    order = random.Random(seed).choices(range(len(digests)), k=n_requests)
    run = _Run()
    t0 = time.perf_counter()
    buf_bytes = max(sizes) + 64 * 2**10
    await asyncio.gather(
        *(_client(port, reqs, sizes, digests, order, run, timeout_s, 25, buf_bytes) for _ in range(conns))
    )
    return run, time.perf_counter() - t0
