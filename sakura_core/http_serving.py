"""What the project's aiohttp servers (the cloud server, the phone agent, the demo) and their clients share: the
bound port, whether a host is loopback, the bearer-token check and its rate limit on wrong tokens (written once
here)."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["TokenThrottle", "bearer_token", "bound_port", "is_loopback", "token_matches"]

logger = logging.getLogger(__name__)


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


class TokenThrottle:
    """Rate limit on wrong bearer tokens, per client address: past ``max_failures`` wrong tokens from one address
    within ``window_s`` the next ones are answered 429 with ``Retry-After`` (the rest of that window) instead of
    401. A right token is checked first and never throttled. At most ``max_addresses`` addresses are tracked (the
    oldest entry goes first), and one warning line per ``log_interval_s`` sums up what was refused.

    Args:
        max_failures: wrong tokens one address may send per window before 429s.
        window_s: seconds of a window, counted from an address's first wrong token in it.
        max_addresses: addresses tracked at most (bounded memory under a flood of addresses).
        log_interval_s: seconds between two warning lines.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(
        self,
        max_failures: int = 20,
        window_s: float = 60.0,
        max_addresses: int = 4096,
        log_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_failures < 1 or window_s <= 0 or max_addresses < 1 or log_interval_s < 0:
            raise ValueError(
                f"TokenThrottle needs max_failures >= 1, window_s > 0, max_addresses >= 1, log_interval_s >= 0; got "
                f"{max_failures}, {window_s}, {max_addresses}, {log_interval_s}"
            )
        self.max_failures, self.window_s, self.max_addresses = max_failures, window_s, max_addresses
        self.log_interval_s, self._clock = log_interval_s, clock
        self._table: OrderedDict[str, list[float]] = OrderedDict()  # address -> [window start, failures]
        self._last_log: float | None = None
        self._unlogged = [0, 0]  # wrong tokens, of which throttled, since the last line

    def __len__(self) -> int:
        return len(self._table)

    def failed(self, address: str | None) -> float | None:
        """Count one wrong token from ``address``; seconds to put in ``Retry-After`` when it is over the limit
        (answer 429), else None (answer 401)."""
        now = self._clock()
        key = address or "?"
        entry = self._table.get(key)
        if entry is None or now - entry[0] >= self.window_s:
            entry = [now, 0]
            self._table.pop(key, None)
            while len(self._table) >= self.max_addresses:
                self._table.popitem(last=False)
            self._table[key] = entry
        entry[1] += 1
        over = entry[1] > self.max_failures
        self._note(now, key, over)
        return max(1.0, entry[0] + self.window_s - now) if over else None

    def _note(self, now: float, address: str, throttled: bool) -> None:
        self._unlogged[0] += 1
        self._unlogged[1] += throttled
        if self._last_log is not None and now - self._last_log < self.log_interval_s:
            return
        since = "" if self._last_log is None else f" in the last {now - self._last_log:.0f} s"
        wrong, limited = self._unlogged
        self._last_log, self._unlogged = now, [0, 0]
        logger.warning(
            "refused %d wrong bearer token(s)%s (%d rate limited; latest from %s; %d address(es) tracked)",
            wrong,
            since,
            limited,
            address,
            len(self._table),
        )
