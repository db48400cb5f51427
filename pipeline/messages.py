"""The engine's message types: a captured Frame, the Result every published kind subclasses and
the detect stage's Detections; each model's own result is in its package
(stages/models/<model>/result.py).

Every item carries its camera, a per-camera monotonic seq, the wall-clock capture time in ns
and a deadline (capture time + the camera's staleness budget); stages drop items past it.
Results say which backend and model produced them, and whether the weights were synthetic.
A result describes its own wire form: `header_fields()` (JSON) and `arrays()` (binary parts),
which pipeline.wire turns into `[topic, header, *parts]` (docs/protocol.md).
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
    """Fields every published result shares; subclasses add their payload.

    The topic is `<kind>/<camera>`. Subclasses override header_fields() and arrays() to put
    their payload on the wire; the base puts `extra` in the header and sends no binary part.
    """

    kind: str
    camera: str
    seq: int
    capture_ts_ns: int
    deadline_ns: int
    backend: str = "none"
    model: str = "none"
    synthetic: bool = False
    extra: dict = field(default_factory=dict)

    def expired(self, at_ns: int | None = None) -> bool:
        """True once the result is past its camera's staleness budget."""
        return (now_ns() if at_ns is None else at_ns) > self.deadline_ns

    @property
    def topic(self) -> str:
        return f"{self.kind}/{self.camera}"

    def header_fields(self) -> dict:
        """Kind-specific JSON header fields (beside the common ones pipeline.wire writes)."""
        return dict(self.extra)

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """Named binary parts, in wire order."""
        return []


def _no_boxes() -> np.ndarray:
    return np.zeros((0, 4), np.float32)


def _no_scores() -> np.ndarray:
    return np.zeros((0,), np.float32)


@dataclass(slots=True, kw_only=True)
class Detections(Result):
    """Objects found on one frame, published on `det/<camera>`.

    boxes: float32 [N, 4] as (x1, y1, x2, y2) in image pixels; scores: float32 [N];
    labels: N class names. width/height: the frame's size in pixels. A frame that reaches
    publish with no detector configured is published with N = 0 and model "none"
    (Detections.without_detector), so subscribers see every frame's size and timing.
    """

    kind: str = "det"
    width: int = 0
    height: int = 0
    boxes: np.ndarray = field(default_factory=_no_boxes)
    scores: np.ndarray = field(default_factory=_no_scores)
    labels: tuple[str, ...] = ()
    source: str = ""

    @classmethod
    def without_detector(cls, frame: Frame) -> Detections:
        """The det message of a frame no detector looked at: no boxes, the frame's size."""
        h, w = frame.image.shape[:2]
        return cls(
            camera=frame.camera,
            seq=frame.seq,
            capture_ts_ns=frame.capture_ts_ns,
            deadline_ns=frame.deadline_ns,
            width=int(w),
            height=int(h),
            source=frame.source,
        )

    def header_fields(self) -> dict:
        return {
            **self.extra,
            "width": self.width,
            "height": self.height,
            "source": self.source,
            "count": int(self.boxes.shape[0]),
            "labels": list(self.labels),
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        return [
            ("boxes", np.asarray(self.boxes, np.float32).reshape(-1, 4)),
            ("scores", np.asarray(self.scores, np.float32).reshape(-1)),
        ]


def box4(box: np.ndarray) -> np.ndarray:
    """A box as float32 [4], the wire form of a result's box."""
    return np.asarray(box, np.float32).reshape(4)
