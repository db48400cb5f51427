"""The per-frame pose on `pose/<camera>`: one tracked person's 308 keypoints from the CPU landmark
models with fused Sapiens2 keyframes, and per keypoint where its value came from and the age of
the keyframe behind it (docs/protocol.md, "Per-frame pose"; docs/live-pose.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stages.models.sapiens2.result import PoseResult

# the `source` column (stages.landmarks.fusion's codes): what each keypoint is this frame
SOURCE_NAMES = ("absent", "cpu", "keyframe")
# how a subscriber tells and reads a per-frame pose (the `meta` topic's pose.live, docs/meta.json)
WIRE_META = {
    "marker": 'a pose message whose header has "live": true is a per-frame pose; without it, '
    "a Sapiens2 keyframe",
    "model": "mediapipe-landmarks",
    "header": {
        "landmark_models": "the landmark models run this frame: body, hands, face",
        "keyframe_seq": "seq of the Sapiens2 keyframe fused into this track, null if none yet",
    },
    "parts": {
        "source": "int8 [K]: per keypoint, index into source_names",
        "keyframe_age_ms": "float32 [K]: age of the keyframe behind the value, NaN if none",
    },
    "source_names": list(SOURCE_NAMES),
}


@dataclass(slots=True, kw_only=True)
class LivePoseResult(PoseResult):
    """A PoseResult (same header and `keypoints` / `box` parts, so a subscriber of Sapiens2's
    poses reads it unchanged) with `"live": true`, the landmark models that ran
    (`landmark_models`), the keyframe fused into it (`keyframe_seq`, None if none yet) and two
    more parts: `source` int8 [K] (SOURCE_NAMES) and `keyframe_age_ms` float32 [K] (NaN where
    no keyframe is behind the value)."""

    parts: tuple[str, ...] = ()
    keyframe_seq: int | None = None
    source: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    keyframe_age_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def header_fields(self) -> dict:
        return {
            **PoseResult.header_fields(self),
            "live": True,
            "landmark_models": list(self.parts),
            "keyframe_seq": self.keyframe_seq,
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        return [
            *PoseResult.arrays(self),
            ("source", np.asarray(self.source, np.int8).reshape(-1)),
            ("keyframe_age_ms", np.asarray(self.keyframe_age_ms, np.float32).reshape(-1)),
        ]
