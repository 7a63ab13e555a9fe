"""What an edit transfers before its lanes start, on a trace: the template image (``sakura_core.edit.open_template``
fetches it, and the manifest, before the pipelined edit begins). The simulator (``simulate``'s
``template_image_bytes``), the oracle and the fluid bound charge it the same way, from the trace's start, so their
latencies stay comparable to a live edit's and to each other."""

from __future__ import annotations

from ..fetch.traces import Trace

__all__ = ["template_image_s"]


def template_image_s(trace: Trace, start_s: float, nbytes: int, rtt_s: float) -> float:
    """Seconds from the template image's request at ``start_s`` on ``trace`` until its last byte: one round trip
    ``rtt_s`` before its first byte, then its ``nbytes`` at the trace's rate (0 for no image)."""
    if nbytes < 0 or rtt_s < 0:
        raise ValueError(f"the template image needs nbytes >= 0 and rtt_s >= 0, got {nbytes} and {rtt_s}")
    if nbytes == 0:
        return 0.0
    return float(trace.finish_time(start_s + rtt_s, nbytes) - start_s)
