"""The link an edit fetches over, as one typed value: the real link (``live``), a constant emulated rate
(``fixed:<Mbit/s>``) or a bandwidth trace file (``trace:<path>``).

:meth:`LinkSpec.parse` is the one place the string form is read (node widgets, the phone job JSON, CLI flags);
:meth:`LinkSpec.trace` gives the emulated link's :class:`~sakura_core.fetch.traces.Trace` (a trace file is read
once, when the spec is parsed, so a bad file fails early); ``str(spec)`` / :meth:`LinkSpec.to_wire` give the string
form back. :func:`shaped_fetcher` paces a shard client by the spec's trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .shaper import TraceShaper
from .traces import Trace, load_trace

__all__ = ["LINK_KINDS", "LinkSpec", "shaped_fetcher"]

LINK_KINDS = ("live", "fixed", "trace")
_FORMS = "'live', 'fixed:<Mbit/s>' (e.g. fixed:20) or 'trace:<path to a trace file>'"


@dataclass(frozen=True)
class LinkSpec:
    """How the link of an edit behaves.

    Attributes:
        kind: "live" (the real link, not paced), "fixed" (constant rate, paced in the client) or "trace" (a
            bandwidth trace file, paced in the client).
        mbit_s: the fixed rate in Mbit/s (> 0, finite); only for ``kind == "fixed"``.
        path: the trace file (Pensieve, Sabre JSON or Mahimahi); only for ``kind == "trace"``.
    """

    kind: str = "live"
    mbit_s: float | None = None
    path: str | None = None
    _trace: Trace | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise ValueError(f"link kind {self.kind!r} is not one of {', '.join(LINK_KINDS)}; write {_FORMS}")
        if self.kind == "fixed":
            if self.path is not None or not isinstance(self.mbit_s, (int, float)) or isinstance(self.mbit_s, bool):
                raise ValueError(f"a fixed link needs mbit_s (Mbit/s) and no path, got {self.mbit_s!r}, {self.path!r}")
            if not (math.isfinite(self.mbit_s) and self.mbit_s > 0):
                raise ValueError(f"fixed link rate {self.mbit_s!r} Mbit/s must be > 0 and finite, e.g. fixed:20")
            object.__setattr__(self, "_trace", Trace.constant(float(self.mbit_s)))
        elif self.kind == "trace":
            if self.mbit_s is not None or not isinstance(self.path, str) or not self.path.strip():
                raise ValueError(f"a trace link needs a trace file path and no mbit_s, got {self.path!r}")
            object.__setattr__(self, "_trace", load_trace(self.path))  # TraceFormatError names the file and fix
        elif self.mbit_s is not None or self.path is not None:
            raise ValueError(f"a live link takes no rate or path, got {self.mbit_s!r}, {self.path!r}")

    @classmethod
    def live(cls) -> LinkSpec:
        """The real link."""
        return cls("live")

    @classmethod
    def fixed(cls, mbit_s: float) -> LinkSpec:
        """A constant emulated link of ``mbit_s`` Mbit/s."""
        return cls("fixed", mbit_s=mbit_s)

    @classmethod
    def trace_file(cls, path: str | Path) -> LinkSpec:
        """An emulated link following the trace file at ``path`` (read now)."""
        return cls("trace", path=str(path))

    @classmethod
    def parse(cls, spec: str | LinkSpec | None) -> LinkSpec:
        """``None``, ``""`` or ``"live"``; ``"fixed:<Mbit/s>"``; ``"trace:<path>"`` -> a spec (a spec is returned as
        is). ``ValueError`` names the bad value and the forms that work."""
        if isinstance(spec, LinkSpec):
            return spec
        if spec is None or (isinstance(spec, str) and spec.strip() in ("", "live")):
            return cls.live()
        if not isinstance(spec, str):
            raise ValueError(f"link {spec!r} is a {type(spec).__name__}; write {_FORMS}")
        kind, sep, value = spec.strip().partition(":")
        if kind == "fixed" and sep:
            try:
                mbit_s = float(value)
            except ValueError as e:
                raise ValueError(f"link {spec!r}: {value!r} is not a number of Mbit/s; write e.g. fixed:20") from e
            return cls.fixed(mbit_s)
        if kind == "trace" and sep:
            if not value.strip():
                raise ValueError(f"link {spec!r} names no file; write trace:<path to a trace file>")
            return cls.trace_file(value.strip())
        raise ValueError(f"link {spec!r} is not understood; write {_FORMS}")

    @property
    def emulated(self) -> bool:
        """True when the client paces the transfer (fixed or trace); False for the real link."""
        return self.kind != "live"

    def trace(self) -> Trace | None:
        """The emulated link's trace (a fixed rate is a one-segment trace); ``None`` for the real link."""
        return self._trace

    def to_wire(self) -> str:
        """The string form (what the phone job JSON and the node reports carry); ``parse(to_wire())`` == self."""
        if self.kind == "fixed":
            return f"fixed:{self.mbit_s:g}"
        if self.kind == "trace":
            return f"trace:{self.path}"
        return "live"

    def __str__(self) -> str:
        return self.to_wire()

    @property
    def label(self) -> str:
        """Short human form for summaries and plot titles: a trace is named by its file's basename only."""
        if self.kind == "fixed":
            return f"fixed {self.mbit_s:g} Mbit/s"
        if self.kind == "trace" and self.path is not None:  # a trace link always has its path (__post_init__)
            return f"trace {Path(self.path).name}"
        return "live link"


def shaped_fetcher(client, link: LinkSpec | Trace | None):
    """``async (digest, nbytes, on_chunk=None) -> bytes`` over ``client`` (a ``ShardClient``), paced by the link's
    trace (a ``LinkSpec``, a ``Trace``, or ``None`` = the real link, not paced); ``on_chunk(n)`` after each chunk
    received (the pipeline shows the policy the transfer in progress)."""
    trace = link.trace() if isinstance(link, LinkSpec) else link
    shaper = TraceShaper(trace) if trace is not None else None

    async def fetch_blob(digest: str, nbytes: int, on_chunk=None) -> bytes:
        if shaper is None:
            return await client.fetch_shard(digest, expected_bytes=nbytes, on_chunk=on_chunk)
        await shaper.request_latency()
        return await client.fetch_shard(digest, expected_bytes=nbytes, throttle=shaper.throttle, on_chunk=on_chunk)

    return fetch_blob
