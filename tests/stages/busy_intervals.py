"""Device busy time measured outside the stage: the seconds a set of (begin, end) intervals
covers, overlaps counted once (tests/stages/test_infer.py, test_infer_overlap.py)."""

from __future__ import annotations


def union_s(intervals: list[tuple[float, float]], start: float = 0.0, end: float = 1e300) -> float:
    """Seconds within [start, end] covered by at least one of the intervals."""
    total, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total
