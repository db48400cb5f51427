"""Sapiens2's published result: one person's keypoints on `pose/<camera>` (its wire form,
docs/protocol.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Result, box4


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
            ("box", box4(self.box)),
        ]
