"""Timing helpers the bench scripts share: best-of-N wall time of a callable."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    """Best wall time (s) of `repeat` runs of fn(): the least disturbed by a noisy machine."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
