"""How good a rig's 3D is without ground truth: reprojection error per view, its median
direction (a view whose lens or pose disagrees with the others leaves its points off one way),
and limb-length steadiness over a clip (a rigid bone keeps its length; Pose2Sim reports the
first, and the coefficient of variation of segment lengths is the usual check on markerless
mocap).
"""

from __future__ import annotations

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
