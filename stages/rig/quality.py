"""How good a rig's 3D is without ground truth: reprojection error per view, its median
direction (a view whose lens or pose disagrees with the others leaves its points off one way),
and limb-length steadiness over a clip (a rigid bone keeps its length; Pose2Sim reports the
first, and the coefficient of variation of segment lengths is the usual check on markerless
mocap).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from npu.models.sapiens2.keypoints import INDEX
from stages.rig.calibration import Camera

# Bones of the COCO body whose length a person cannot change: (name, from, to) keypoints.
LIMBS: tuple[tuple[str, str, str], ...] = tuple(
    (f"{side}_{bone}", f"{side}_{a}", f"{side}_{b}")
    for side in ("left", "right")
    for bone, a, b in (
        ("upper_arm", "shoulder", "elbow"),
        ("forearm", "elbow", "wrist"),
        ("thigh", "hip", "knee"),
        ("shank", "knee", "ankle"),
    )
) + (
    ("shoulders", "left_shoulder", "right_shoulder"),
    ("hips", "left_hip", "right_hip"),
)
# the same as keypoint indices, (distal end, proximal end); shoulders and hips have no distal
# end: either may be the one to move (stages/rig/consistency.py, stages/rig/bone_fit.py)
BONES: tuple[tuple[str, int, int], ...] = tuple((n, INDEX[b], INDEX[a]) for n, a, b in LIMBS)


def reprojection_errors(
    cameras: Sequence[Camera], points: np.ndarray, seen: np.ndarray, mask: np.ndarray
) -> list[np.ndarray]:
    """Per view v, the pixel distances between the 3D points projected through its lens and
    the 2D points it saw, where mask holds. points float [T, K, 3] (NaN: not triangulated);
    seen float [V, T, K, 2]; mask bool [V, T, K] (e.g. the views a point was triangulated from)."""
    out = []
    for v, cam in enumerate(cameras):
        keep = mask[v] & np.isfinite(points).all(-1) & np.isfinite(seen[v]).all(-1)
        projected = cam.project(points[keep])
        out.append(np.linalg.norm(projected - seen[v][keep], axis=-1))
    return out


def reprojection_offsets(
    cameras: Sequence[Camera], points: np.ndarray, seen: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """Per view, the median of (projected - seen) in x and y, px, float [V, 2] (NaN where the
    view has no point): near 0 when a view's errors are the 2D model's scatter, one way when
    its calibration does not fit the others'. Arguments as reprojection_errors'."""
    out = np.full((len(cameras), 2), np.nan)
    for v, cam in enumerate(cameras):
        keep = mask[v] & np.isfinite(points).all(-1) & np.isfinite(seen[v]).all(-1)
        if keep.any():
            out[v] = np.median(cam.project(points[keep]) - seen[v][keep], axis=0)
    return out


class RecentResiduals:
    """Each view's last `size` residuals (projected - seen, px) of the points triangulated
    from it: the rig3d stage's live per-camera median reprojection error and offset. Added
    to on one thread, summarised on any."""

    def __init__(self, cameras: Sequence[Camera], size: int = 2000) -> None:
        self.cameras = list(cameras)
        self._lock = threading.Lock()
        self._ring = np.zeros((len(self.cameras), size, 2))
        self._count = np.zeros(len(self.cameras), np.int64)  # residuals ever added, per view

    def add(self, points: np.ndarray, observed: np.ndarray, used: np.ndarray) -> None:
        """points float [P, K, 3] (NaN: not triangulated); observed float [V, P, K, >= 2]
        (x, y first); used bool [P, K, V], the views each point was made from."""
        size = self._ring.shape[1]
        for v, cam in enumerate(self.cameras):
            keep = used[..., v] & np.isfinite(points).all(-1)
            if not keep.any():
                continue
            r = cam.project(points[keep]) - observed[v][keep][:, :2]
            r = r[np.isfinite(r).all(-1)][-size:]
            with self._lock:
                at = (self._count[v] + np.arange(len(r))) % size
                self._ring[v, at] = r
                self._count[v] += len(r)

    def summary(self) -> dict[str, tuple[float, float, float, int]]:
        """camera -> (median error px, median offset x px, y px, residuals held); cameras
        with none are left out."""
        out = {}
        for v, cam in enumerate(self.cameras):
            with self._lock:
                n = int(min(self._count[v], self._ring.shape[1]))
                r = self._ring[v, :n].copy()
            if n:
                dx, dy = np.median(r, axis=0)
                out[cam.name] = (float(np.median(np.hypot(*r.T))), float(dx), float(dy), n)
        return out


def limb_lengths(points: np.ndarray, limbs=LIMBS) -> dict[str, np.ndarray]:
    """Each limb's length per frame (NaN where an end is missing), points float [T, 308, 3]."""
    return {
        name: np.linalg.norm(points[:, INDEX[a]] - points[:, INDEX[b]], axis=-1)
        for name, a, b in limbs
    }


def coefficient_of_variation(lengths: np.ndarray, min_frames: int = 10) -> float:
    """Standard deviation over mean of the finite lengths; NaN with fewer than min_frames."""
    finite = lengths[np.isfinite(lengths)]
    if len(finite) < min_frames:
        return float("nan")
    return float(finite.std() / finite.mean())
