"""AdaFace's published result: one face's embedding and identity on `face/<camera>` (its wire
form, docs/protocol.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Result, box4


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
            ("box", box4(self.box)),
            ("landmarks", np.asarray(self.landmarks, np.float32).reshape(-1, 2)),
            ("embedding", np.asarray(self.embedding, np.float32).reshape(-1)),
        ]
