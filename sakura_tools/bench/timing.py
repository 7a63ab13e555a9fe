"""Best-of-N wall-clock timing for the benchmarks (one definition)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["best_time_s"]


def best_time_s(fn: Callable[[], object], repeats: int, warmup: bool = False) -> float:
    """The fastest of ``repeats`` calls of ``fn``, seconds (after one untimed call when ``warmup``)."""
    if warmup:
        fn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
