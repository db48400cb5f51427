"""CLIP's published result: one region's zero-shot label probabilities on `clip/<camera>` (its
wire form, docs/protocol.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Result, box4


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
            ("box", box4(self.box)),
        ]
