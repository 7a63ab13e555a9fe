"""What keeps ``sakura serve`` answering under floods of idle or malformed connections: a connection cap below the
process's file-descriptor limit, and one log line per kind of refused connection per interval.

* :func:`capped_protocol_factory` wraps aiohttp's protocol factory: past ``max_connections`` open connections a new
  one is closed at once (it never holds a descriptor, so ``accept()`` never fails with EMFILE for the server's own
  files and sockets). Idle and half-sent requests are closed by aiohttp's keep-alive timeout
  (``ServerConfig.idle_timeout_s``, passed as ``keepalive_timeout``: aiohttp arms it when a connection opens, so
  it is also the header timeout).
* :class:`RefusalLog` is a logging filter for aiohttp's server logger and a loop exception handler for accept
  errors: the first refusal of a kind (``BadStatusLine``, ``LineTooLong``, ``EMFILE`` ...) in an interval is one line
  without a traceback; the rest are counted and summed up in the next line of that kind. Only a request aiohttp
  could not parse is called malformed: an exception a handler let out is not the client's doing and is logged as it
  is.
* :class:`IntervalLog` is that rule for any kind of event (store faults use it too).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import cast

__all__ = ["FD_RESERVE", "IntervalLog", "RefusalLog", "capped_protocol_factory", "connection_cap"]

logger = logging.getLogger(__name__)

#: Descriptors kept free of connections: the store's files, the log, the executor's pipes.
FD_RESERVE = 64


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered to the process's soft RLIMIT_NOFILE minus :data:`FD_RESERVE` (at least 1)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE))


class _Refused(asyncio.Protocol):
    """A connection over the cap: closed as soon as it is made."""

    def __init__(self, log: RefusalLog):
        self._log = log

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()  # a stream server's transport: asyncio hands a Transport
        self._log.refused("over the connection cap")


def capped_protocol_factory(server, max_connections: int, log: RefusalLog) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for ``loop.create_server``: aiohttp's ``server`` (an ``AppRunner``'s ``server``) until it
    holds ``max_connections`` connections, a closing stand-in beyond."""

    def factory() -> asyncio.Protocol:
        if len(server.connections) >= max_connections:
            return _Refused(log)
        return server()

    return factory


class IntervalLog:
    """One warning line per kind of event per ``interval_s``; the events of a kind met meanwhile are counted and
    summed up in its next line.

    Args:
        log: the logger the lines go to.
        prefix: what every line starts with (e.g. ``"refused a connection: "``).
        interval_s: seconds between two lines of one kind.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(
        self, log: logging.Logger, prefix: str, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ):
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0 seconds, got {interval_s}")
        self._log, self._prefix = log, prefix
        self.interval_s, self._clock = interval_s, clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def event(self, kind: str, detail: str = "") -> bool:
        """Count one event of ``kind``; log ``prefix + kind`` (and ``detail``) unless a line of its kind was logged
        this interval. Returns whether a line was logged."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        self._last[kind] = now
        more = self._suppressed.pop(kind, 0)
        extra = f" (and {more} more in the last {self.interval_s:g} s)" if more else ""
        self._log.warning("%s%s%s%s", self._prefix, kind, extra, f": {detail}" if detail else "")
        return True


class RefusalLog(logging.Filter):
    """One warning line per kind of refused connection per ``interval_s`` (see the module docstring).

    Args:
        interval_s: seconds between two lines of one kind.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._lines = IntervalLog(logger, "refused a connection: ", interval_s, clock)
        self.interval_s = interval_s

    def refused(self, kind: str) -> None:
        """Count one refused connection of ``kind``; log a line if none of its kind was logged this interval."""
        self._lines.event(kind)

    def filter(self, record: logging.LogRecord) -> bool:
        """For aiohttp's server logger: a request aiohttp could not parse becomes a :meth:`refused` count (no
        traceback); other records pass (a handler's own failure is not blamed on the client)."""
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and record.getMessage().startswith("Error handling request"):
            self.refused(f"malformed request ({type(exc).__name__})")
            return False
        return True

    def loop_exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """For ``loop.set_exception_handler``: accept errors (EMFILE, ENFILE, ...) and resets of idle connections
        are counted like refusals; anything else goes to asyncio's default handler."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and "accept" in str(context.get("message", "")):
            self.refused(f"accept failed ({exc.strerror or type(exc).__name__})")
            return
        if isinstance(exc, ConnectionError):
            self.refused(f"connection error ({type(exc).__name__})")
            return
        loop.default_exception_handler(context)
