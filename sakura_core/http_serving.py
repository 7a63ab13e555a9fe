"""What the project's aiohttp servers (the cloud server, the phone agent, the demo) share."""

from __future__ import annotations

__all__ = ["bound_port"]


def bound_port(runner) -> int:
    """The TCP port a started ``aiohttp.web.AppRunner`` listens on (useful with port 0)."""
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError(f"runner has no TCP address: {runner.addresses}")
