"""Lower bound of a pipelined run from the *pure* busy time of its lanes.

The live pipeline records compute spans from one layer hook to the next; such a span also holds any time the
compute lane waited for a shard (recorded as a ``stall`` event inside it). Taking those spans as "busy" makes a run
that mostly waits look perfectly pipelined (latency / bound ~ 1.0 by construction). Here the compute lane's busy
time is its spans minus the stalls inside them; transfer (``fetch``) and ``decode`` spans are the work itself. The
bound ``max(compute, transfer, decode)`` is what a perfect overlap of the three lanes would take; a run with stalls
while the link was idle is reported well above it.
"""

from __future__ import annotations

__all__ = ["lane_busy_s", "lower_bound", "merge_spans"]


def merge_spans(spans) -> list[tuple[float, float]]:
    """Union of (start, end) spans, sorted, overlaps merged; empty or negative spans dropped."""
    out: list[tuple[float, float]] = []
    for s, e in sorted((float(s), float(e)) for s, e in spans if e > s):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(spans) -> float:
    return sum(e - s for s, e in spans)


def _subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged spans ``a`` minus merged spans ``b``."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def lane_busy_s(events: list[dict], lane: str, minus: tuple[str, ...] = ()) -> float:
    """Seconds ``lane`` was busy (its spans merged), not counting time covered by the lanes in ``minus``."""
    spans = merge_spans((e["start"], e["end"]) for e in events if e["lane"] == lane)
    if minus:
        spans = _subtract(spans, merge_spans((e["start"], e["end"]) for e in events if e["lane"] in minus))
    return _length(spans)


def lower_bound(events: list[dict], latency_s: float) -> dict:
    """Pure busy seconds per lane, the bound ``max`` of them, and ``latency_s / bound``."""
    compute = lane_busy_s(events, "compute", minus=("stall",))
    fetch = lane_busy_s(events, "fetch")
    decode = lane_busy_s(events, "decode")
    bound = max(compute, fetch, decode)
    return {
        "compute_busy_s": compute,
        "fetch_busy_s": fetch,
        "decode_busy_s": decode,
        "stall_s": lane_busy_s(events, "stall"),
        "bound_s": bound,
        "latency_over_bound": latency_s / bound if bound > 0 else float("inf"),
    }
