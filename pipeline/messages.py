"""Message types that flow between stages: a captured Frame and one result type per kind.

Every item carries its camera, a per-camera monotonic seq, the wall-clock capture time in ns
and a deadline (capture time + the camera's staleness budget); stages drop items past it.
Results say which backend and model produced them, and whether the weights were synthetic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


def now_ns() -> int:
    """Wall-clock time in ns, the clock of capture_ts and deadlines."""
    return time.time_ns()


@dataclass(slots=True)
class Frame:
    """One captured image. image: uint8 [H, W, 3] in BGR order (OpenCV's)."""

    camera: str
    seq: int
    capture_ts_ns: int
    deadline_ns: int
    image: np.ndarray
    source: str = ""

    def expired(self, at_ns: int | None = None) -> bool:
        """True once the frame is past its camera's staleness budget."""
        return (now_ns() if at_ns is None else at_ns) > self.deadline_ns


@dataclass(slots=True)
class Result:
    """Fields every published result shares; subclasses add their payload."""

    kind: str
    camera: str
    seq: int
    capture_ts_ns: int
    deadline_ns: int
    backend: str = "none"
    model: str = "none"
    synthetic: bool = False
    extra: dict = field(default_factory=dict)
