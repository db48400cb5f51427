"""Message types that flow between stages: a captured Frame and one result type per kind.

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


def _box4(box: np.ndarray) -> np.ndarray:
    return np.asarray(box, np.float32).reshape(4)


@dataclass(slots=True, kw_only=True)
class PoseResult(Result):
    """One person's whole-body keypoints, published on `pose/<camera>`.

    keypoints: float32 [K, 3] as (x, y, score) in frame pixels (K = 308 for Sapiens2);
    box: float32 [4] (x1, y1, x2, y2), the person box the pose was computed in; track_id:
    the person's track; score: the person detector's score; age_ms: capture -> postprocess
    time of this pose; since_previous_ms: capture time since the track's previous pose (None
    for its first).
    """

    kind: str = "pose"
    track_id: int = -1
    keypoints: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.float32))
    box: np.ndarray = field(default_factory=lambda: np.zeros(4, np.float32))
    score: float = 0.0
    age_ms: float = 0.0
    since_previous_ms: float | None = None

    def header_fields(self) -> dict:
        return {
            **self.extra,
            "track_id": self.track_id,
            "count": int(self.keypoints.shape[0]),
            "score": round(float(self.score), 6),
            "age_ms": round(float(self.age_ms), 3),
            "since_previous_ms": (
                None if self.since_previous_ms is None else round(self.since_previous_ms, 3)
            ),
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        return [
            ("keypoints", np.asarray(self.keypoints, np.float32).reshape(-1, 3)),
            ("box", _box4(self.box)),
        ]


@dataclass(slots=True, kw_only=True)
class FaceResult(Result):
    """One face's identity, published on `face/<camera>`.

    box: float32 [4] (x1, y1, x2, y2) in frame pixels; landmarks: float32 [P, 2] alignment
    points in frame pixels (P = 5, or 4 for BlazeFace's approximation); embedding: float32
    [D], L2-normalised; identity: the gallery name or None (no gallery match); similarity:
    cosine to the best identity (-1 with an empty gallery); margin: over the second best.
    """

    kind: str = "face"
    box: np.ndarray = field(default_factory=lambda: np.zeros(4, np.float32))
    landmarks: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.float32))
    embedding: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    identity: str | None = None
    similarity: float = -1.0
    margin: float = 0.0
    score: float = 0.0
    track_id: int | None = None

    def header_fields(self) -> dict:
        return {
            **self.extra,
            "identity": self.identity,
            "similarity": round(float(self.similarity), 6),
            "margin": round(float(self.margin), 6),
            "score": round(float(self.score), 6),
            "track_id": self.track_id,
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        return [
            ("box", _box4(self.box)),
            ("landmarks", np.asarray(self.landmarks, np.float32).reshape(-1, 2)),
            ("embedding", np.asarray(self.embedding, np.float32).reshape(-1)),
        ]


@dataclass(slots=True, kw_only=True)
class ClipResult(Result):
    """Zero-shot label probabilities of one region, published on `clip/<camera>`.

    labels: L label names; probabilities: float32 [L] summing to 1; box: float32 [4]
    (x1, y1, x2, y2) of the region (the whole frame for frame labels); track_id: the
    person's track for person crops, None for the whole frame.
    """

    kind: str = "clip"
    labels: tuple[str, ...] = ()
    probabilities: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    box: np.ndarray = field(default_factory=lambda: np.zeros(4, np.float32))
    track_id: int | None = None

    @property
    def top(self) -> tuple[str, float]:
        """(label, probability) of the most probable label (first on ties)."""
        j = int(np.argmax(self.probabilities))
        return self.labels[j], float(self.probabilities[j])

    def header_fields(self) -> dict:
        label, prob = self.top if self.labels else (None, 0.0)
        return {
            **self.extra,
            "labels": list(self.labels),
            "top_label": label,
            "top_probability": round(prob, 6),
            "track_id": self.track_id,
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        return [
            ("probabilities", np.asarray(self.probabilities, np.float32).reshape(-1)),
            ("box", _box4(self.box)),
        ]
