"""What the project's aiohttp servers (the cloud server, the phone agent, the demo) and their clients share: the
bound port, whether a host is loopback, and the bearer-token check (written once here)."""

from __future__ import annotations

import hmac
import ipaddress

__all__ = ["bearer_token", "bound_port", "is_loopback", "token_matches"]


def bound_port(runner) -> int:
    """The TCP port a started ``aiohttp.web.AppRunner`` listens on (useful with port 0)."""
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError(f"runner has no TCP address: {runner.addresses}")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1); a host name may resolve to anything,
    so any other name is not loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (scheme case-insensitive), or None."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_matches(given: str | None, *allowed: str | None) -> bool:
    """Constant-time check of a bearer token against the configured ones (None entries are skipped); header bytes
    that are not UTF-8 (kept by aiohttp as surrogate escapes) simply do not match (401, never 500)."""
    if given is None:
        return False
    raw = given.encode("utf-8", "surrogateescape")
    return any(t is not None and hmac.compare_digest(raw, t.encode()) for t in allowed)
