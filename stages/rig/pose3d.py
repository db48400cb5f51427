"""The `pose3d/<rig>` result: a rig instant's 3D people (docs/protocol.md, "pose3d").

A pipeline.messages.Result whose `camera` is the rig's name (so its topic is
`pose3d/<rig>`) and whose `seq` is the rig's group number; it lives with the rig stage, the
engine does not know it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Result

# what the meta message says of pose3d (docs/meta.json): the columns of `points`, its unit, and
# where the keypoint names and skeleton are (the 2D model's, under meta.pose)
WIRE_META = {
    "columns": ["x", "y", "z", "confidence"],
    "units": "m",
    "keypoints_from": "pose",
}


def _empty(*shape: int, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


@dataclass(slots=True, kw_only=True)
class Pose3DResult(Result):
    """points float32 [P, K, 4] (x, y, z in m in the calibration's world frame, confidence;
    NaN x, y, z and confidence 0 where not triangulated); error float32 [P, K], mean
    reprojection error in px of the views used (NaN where not triangulated); used uint8
    [P, K, V], 1 where camera v (`cameras` order) was used. person_ids [P] rig person ids;
    tracks[p] camera -> 2D track id; views camera -> frame seq of the group's frames;
    missing: rig cameras with no frame in the group; skew_ns: the group's capture time span;
    age_ms: capture -> triangulation time."""

    kind: str = "pose3d"
    cameras: tuple[str, ...] = ()
    points: np.ndarray = field(default_factory=lambda: _empty(0, 0, 4))
    error: np.ndarray = field(default_factory=lambda: _empty(0, 0))
    used: np.ndarray = field(default_factory=lambda: _empty(0, 0, 0, dtype=np.uint8))
    person_ids: tuple[int, ...] = ()
    tracks: tuple[dict[str, int], ...] = ()
    views: dict[str, int] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    skew_ns: int = 0
    filtered: bool = False
    age_ms: float = 0.0

    def header_fields(self) -> dict:
        return {
            **self.extra,
            "rig": self.camera,
            "cameras": list(self.cameras),
            "count": int(self.points.shape[0]),
            "keypoints": int(self.points.shape[1]),
            "person_ids": [int(i) for i in self.person_ids],
            "tracks": [dict(t) for t in self.tracks],
            "views": dict(self.views),
            "missing": list(self.missing),
            "skew_ns": int(self.skew_ns),
            "skew_ms": round(self.skew_ns / 1e6, 3),
            "filtered": self.filtered,
            "age_ms": round(float(self.age_ms), 3),
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        p, k = self.points.shape[:2]
        return [
            ("points", np.asarray(self.points, np.float32).reshape(p, k, 4)),
            ("error", np.asarray(self.error, np.float32).reshape(p, k)),
            ("used", np.asarray(self.used, np.uint8).reshape(p, k, len(self.cameras))),
        ]
