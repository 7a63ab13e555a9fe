"""Bandwidth traces: Pensieve "cooked", Sabre JSON and Mahimahi formats, auto-detected, as one piecewise-constant type.

A :class:`Trace` is a list of segments (duration, rate) that repeats when a transfer outlives it (as Pensieve's
simulator does). Exact transfer times over it come from the cumulative-bytes curve, so the simulation and the
in-process shaper agree to the byte.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .trace_classes import CLASSES_FILE, classify_path, read_classes_file

__all__ = ["Trace", "TraceFormatError", "TraceScan", "load_trace", "load_traces", "scan_traces", "MAHIMAHI_BIN_S"]

logger = logging.getLogger(__name__)

MAHIMAHI_PACKET_BYTES = 1500
MAHIMAHI_BIN_S = 0.2  # delivery opportunities are counted in 200 ms bins


class TraceFormatError(ValueError):
    """A trace file could not be parsed (names the file, the line and the fix)."""


@dataclass(frozen=True)
class Trace:
    """Piecewise-constant link rate.

    Attributes:
        name: file stem (or a given name).
        durations_s: (segments,) seconds each segment lasts (> 0).
        rates_bytes_per_s: (segments,) delivery rate in each segment (>= 0, not all zero).
        latency_ms: one-way latency added to each request in user space.
        source: file it was read from, or "" for synthetic traces.
        trace_class: 3G / 4G / broadband / 5G / other (see fetch/trace_classes.py), or "" when not classified.
    """

    name: str
    durations_s: np.ndarray
    rates_bytes_per_s: np.ndarray
    latency_ms: float = 0.0
    source: str = ""
    trace_class: str = ""
    _cum: np.ndarray = field(init=False, repr=False, compare=False)
    _edges: np.ndarray = field(init=False, repr=False, compare=False)
    _cum_list: list = field(init=False, repr=False, compare=False)  # _cum and _edges as Python floats
    _edges_list: list = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = np.asarray(self.durations_s, dtype=np.float64)
        r = np.asarray(self.rates_bytes_per_s, dtype=np.float64)
        if d.ndim != 1 or d.shape != r.shape or len(d) == 0:
            raise TraceFormatError(f"trace {self.name!r}: need equal-length, non-empty durations and rates")
        if np.any(d <= 0) or np.any(r < 0) or not np.all(np.isfinite(r)):
            raise TraceFormatError(f"trace {self.name!r}: durations must be > 0 and rates finite and >= 0")
        if float((d * r).sum()) <= 0:
            raise TraceFormatError(f"trace {self.name!r} delivers no bytes at all (every rate is 0)")
        object.__setattr__(self, "durations_s", d)
        object.__setattr__(self, "rates_bytes_per_s", r)
        object.__setattr__(self, "_edges", np.concatenate([[0.0], np.cumsum(d)]))
        object.__setattr__(self, "_cum", np.concatenate([[0.0], np.cumsum(d * r)]))
        object.__setattr__(self, "_edges_list", self._edges.tolist())  # for finish_chain's Python-float loop
        object.__setattr__(self, "_cum_list", self._cum.tolist())

    @classmethod
    def constant(cls, mbit_per_s: float, name: str | None = None, latency_ms: float = 0.0) -> Trace:
        if mbit_per_s <= 0:
            raise TraceFormatError(f"constant trace needs a rate > 0 Mbit/s, got {mbit_per_s}")
        return cls(name or f"const-{mbit_per_s:g}mbps", np.array([1.0]), np.array([mbit_per_s * 1e6 / 8]), latency_ms)

    @property
    def period_s(self) -> float:
        return float(self._edges[-1])

    @property
    def period_bytes(self) -> float:
        return float(self._cum[-1])

    @property
    def mean_mbit_per_s(self) -> float:
        return self.period_bytes * 8 / self.period_s / 1e6

    def rate_at(self, t_s: float) -> float:
        """Rate (bytes/s) at time ``t_s`` (the trace repeats)."""
        i = int(np.searchsorted(self._edges, t_s % self.period_s, side="right")) - 1
        return float(self.rates_bytes_per_s[min(i, len(self.rates_bytes_per_s) - 1)])

    def delivered(self, t_s: float) -> float:
        """Bytes the link can deliver in [0, t_s)."""
        cycles, off = divmod(max(t_s, 0.0), self.period_s)
        return cycles * self.period_bytes + float(np.interp(off, self._edges, self._cum))

    def bytes_between(self, t0_s: float, t1_s: float) -> float:
        return self.delivered(t1_s) - self.delivered(t0_s)

    def round_trip_s(self, least_s: float) -> float:
        """The round trip a request on this link costs: ``least_s`` (the configured least, ``LaneConfig.rtt_s``) or
        twice the trace's one-way latency when that is more."""
        return max(least_s, 2 * self.latency_ms / 1000)

    def finish_time(self, start_s: float, nbytes: float) -> float:
        """When a transfer of ``nbytes`` that starts at ``start_s`` (and has the link to itself) completes."""
        if nbytes <= 0:
            return start_s
        target = self.delivered(start_s) + nbytes
        cycles = math.floor(target / self.period_bytes)
        rem = target - cycles * self.period_bytes
        if rem == 0 and cycles > 0:  # exactly at a period boundary
            cycles, rem = cycles - 1, self.period_bytes
        # invert the cumulative curve inside one period (flat stretches = zero-rate segments: take the first time)
        i = int(np.searchsorted(self._cum, rem, side="left"))
        i = min(max(i, 1), len(self._cum) - 1)
        c0, c1, e0, e1 = self._cum[i - 1], self._cum[i], self._edges[i - 1], self._edges[i]
        t = e0 + (rem - c0) / (c1 - c0) * (e1 - e0) if c1 > c0 else e1
        return max(start_s, cycles * self.period_s + t)

    def finish_times(self, start_s: float, nbytes: np.ndarray) -> np.ndarray:
        """:meth:`finish_time` of every transfer size in ``nbytes`` (any shape; each starting at ``start_s`` alone
        on the link), vectorised (the fluid bound's many sizes; one size is faster through the scalar form, which the
        simulator's transfers take: the two are tested equal)."""
        b = np.asarray(nbytes, dtype=float)
        target = self.delivered(start_s) + np.maximum(b, 0.0)
        cycles = np.floor(target / self.period_bytes)
        rem = target - cycles * self.period_bytes
        edge = (rem == 0) & (cycles > 0)  # exactly at a period boundary
        cycles, rem = np.where(edge, cycles - 1, cycles), np.where(edge, self.period_bytes, rem)
        i = np.clip(np.searchsorted(self._cum, rem, side="left"), 1, len(self._cum) - 1)
        c0, c1, e0, e1 = self._cum[i - 1], self._cum[i], self._edges[i - 1], self._edges[i]
        flat = c1 <= c0
        t = np.where(flat, e1, e0 + (rem - c0) / np.where(flat, 1.0, c1 - c0) * (e1 - e0))
        return np.where(b <= 0, start_s, np.maximum(start_s, cycles * self.period_s + t))

    def finish_chain(self, start_s: float, gaps_s, nbytes, offset_s: float = 0.0) -> list[float]:
        """Transfers back to back from ``start_s``: the i-th is requested ``gaps_s[i]`` seconds (its round trip) after
        the one before it completes and carries ``nbytes[i]``; when each completes. Times are on a clock that reads
        the trace at ``offset_s + t`` (an edit's clock): each is ``finish_time(offset_s + t0, b) - offset_s``, the
        same arithmetic on Python floats with a binary search over the period, so the oracle's exact plan
        evaluations make one call per plan instead of one :meth:`finish_time` per shard (equal: tested). The loop
        body is written out (no call per transfer): the oracle's search runs it millions of times."""
        edges, cum = self._edges_list, self._cum_list
        period, pbytes, n = self.period_s, self.period_bytes, len(cum)
        last_edge, last_cum = edges[-1], cum[-1]
        after, before, floor = bisect.bisect_right, bisect.bisect_left, math.floor
        gaps = gaps_s.tolist() if isinstance(gaps_s, np.ndarray) else [float(g) for g in gaps_s]
        sizes = nbytes.tolist() if isinstance(nbytes, np.ndarray) else [float(b) for b in nbytes]
        t, out = float(start_s), []
        for gap, b in zip(gaps, sizes, strict=True):
            s = offset_s + (t + gap)
            if b > 0:  # finish_time of b bytes from s (np.interp's segment and formula for the bytes by s); the
                # clamps and maxima as comparisons, each picking what min / max would (no call in the loop)
                cycles, off = divmod(s if not 0.0 > s else 0.0, period)
                if off >= last_edge:
                    got = last_cum
                else:  # edges[j] <= off < edges[j + 1]
                    j = after(edges, off) - 1
                    j = 0 if j < 0 else (n - 2 if j > n - 2 else j)
                    got = (cum[j + 1] - cum[j]) / (edges[j + 1] - edges[j]) * (off - edges[j]) + cum[j]
                target = cycles * pbytes + got + b
                k = floor(target / pbytes)
                rem = target - k * pbytes
                if rem == 0 and k > 0:
                    k, rem = k - 1, pbytes
                i = before(cum, rem)
                i = 1 if i < 1 else (n - 1 if i > n - 1 else i)
                c0, c1, e0, e1 = cum[i - 1], cum[i], edges[i - 1], edges[i]
                f = e0 + (rem - c0) / (c1 - c0) * (e1 - e0) if c1 > c0 else e1
                end = k * period + f
                if end > s:
                    s = end
            t = s - offset_s
            out.append(t)
        return out

    def window(self, start_s: float, duration_s: float, step_s: float = 1.0) -> np.ndarray:
        """Mean rate (bytes/s) in consecutive ``step_s`` windows from ``start_s`` (for plots and the oracle)."""
        n = max(1, int(math.ceil(duration_s / step_s)))
        t = start_s + np.arange(n + 1) * step_s
        cum = np.array([self.delivered(x) for x in t])
        return np.diff(cum) / step_s


def _parse_pensieve(text: str, path: Path) -> Trace:
    times, rates = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TraceFormatError(f"{path}:{n}: expected 'time_s<TAB>Mbit/s', got {line[:60]!r}")
        try:
            times.append(float(parts[0]))
            rates.append(float(parts[1]) * 1e6 / 8)
        except ValueError as e:
            raise TraceFormatError(f"{path}:{n}: not numbers: {line[:60]!r}") from e
    if len(times) < 2:
        raise TraceFormatError(f"{path}: a cooked trace needs at least 2 samples, got {len(times)}")
    t = np.asarray(times)
    if np.any(np.diff(t) <= 0):
        raise TraceFormatError(f"{path}: timestamps must increase")
    # sample i holds from t[i] to t[i+1]; the last sample lasts the median gap
    durations = np.append(np.diff(t), np.median(np.diff(t)))
    return Trace(path.stem, durations, np.asarray(rates), 0.0, str(path))


def _parse_sabre(text: str, path: Path) -> Trace:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{path}: invalid JSON: {e}") from e
    if not isinstance(data, list) or not data:
        raise TraceFormatError(f"{path}: Sabre traces are a non-empty JSON list of segments")
    try:
        d = np.array([float(s["duration_ms"]) / 1000 for s in data])
        r = np.array([float(s["bandwidth_kbps"]) * 1000 / 8 for s in data])
        lat = float(np.median([float(s.get("latency_ms", 0)) for s in data]))
    except (KeyError, TypeError, ValueError) as e:
        raise TraceFormatError(f"{path}: each segment needs duration_ms, bandwidth_kbps (latency_ms optional)") from e
    keep = d > 0
    return Trace(path.stem, d[keep], r[keep], lat, str(path))


def _parse_mahimahi(text: str, path: Path) -> Trace:
    try:
        ms = np.array([int(x) for x in text.split()], dtype=np.int64)
    except ValueError as e:
        raise TraceFormatError(f"{path}: Mahimahi traces hold one integer millisecond per line") from e
    if len(ms) == 0 or np.any(np.diff(ms) < 0):
        raise TraceFormatError(f"{path}: Mahimahi timestamps must be present and non-decreasing")
    bins = int(ms[-1] // (MAHIMAHI_BIN_S * 1000)) + 1
    counts = np.bincount((ms // (MAHIMAHI_BIN_S * 1000)).astype(np.int64), minlength=bins)
    rates = counts * MAHIMAHI_PACKET_BYTES / MAHIMAHI_BIN_S
    return Trace(path.stem, np.full(bins, MAHIMAHI_BIN_S), rates.astype(np.float64), 0.0, str(path))


def load_trace(path: str | Path) -> Trace:
    """Read one trace, detecting the format from its content (JSON list / two columns / one integer column)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"cannot read trace {path}: {e}") from e
    head = text.lstrip()[:1]
    if head == "[":
        return _parse_sabre(text, path)
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if len(first.split()) == 2:
        return _parse_pensieve(text, path)
    if len(first.split()) == 1:
        return _parse_mahimahi(text, path)
    raise TraceFormatError(
        f"{path}: unknown trace format (expected Pensieve 'time<TAB>Mbit/s', Sabre JSON or Mahimahi ms lines)"
    )


_DOC_SUFFIXES = (".md", ".rst", ".py", ".html", ".pdf", ".zip", ".gz", ".png", ".jpg")
_DOC_PREFIXES = ("readme", "license", "licence", "copying", "notice")


@dataclass(frozen=True)
class TraceScan:
    """What a trace folder held: the traces (sorted by path, each with its class) and every file not loaded,
    as (path, reason)."""

    traces: list[Trace]
    skipped: list[tuple[str, str]]


def _skip_reason(path: Path) -> str | None:
    name = path.name.lower()
    if name.startswith("."):
        return "hidden file"
    if name == CLASSES_FILE:
        return "the trace classes file"
    if name.startswith(_DOC_PREFIXES) or path.suffix.lower() in _DOC_SUFFIXES:
        return "documentation or archive, not a trace"
    return None


def scan_traces(folder: str | Path, classes_file: str | Path | None = None) -> TraceScan:
    """Every trace under ``folder`` (recursively; ``.txt`` included), classed, with every file it did not load
    named and logged with the reason (documentation, or a parse error)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"trace folder {folder} does not exist")
    if classes_file is None and (folder / CLASSES_FILE).is_file():
        classes_file = folder / CLASSES_FILE
    globs = read_classes_file(classes_file) if classes_file is not None else {}
    traces, skipped = [], []
    for p in sorted(x for x in folder.rglob("*") if x.is_file()):
        reason = _skip_reason(p)
        if reason is None:
            try:
                t = load_trace(p)
            except TraceFormatError as e:
                reason = f"not a trace: {e}"
            else:
                traces.append(
                    replace(t, trace_class=classify_path(p.relative_to(folder), globs, folder.resolve().name))
                )
                continue
        skipped.append((str(p), reason))
        logger.warning("trace folder %s: skipped %s (%s)", folder, p, reason)
    if not traces:
        raise TraceFormatError(f"no trace files in {folder} (skipped: {[s for s, _ in skipped]})")
    return TraceScan(traces, skipped)


def load_traces(folder: str | Path, classes_file: str | Path | None = None) -> list[Trace]:
    """Every trace under ``folder`` (see :func:`scan_traces`; skipped files are logged by name)."""
    return scan_traces(folder, classes_file).traces
