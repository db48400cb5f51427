"""A rig person's limb joints moved, within what their views saw, toward the bone lengths the
person has kept: least squares over the joints of reprojection residuals (undistorted px over
pixel_sigma_px, weighted by confidence as triangulate.py weights its rows) and bone-length
residuals (m over bone_sigma_m) against each bone's median over its recent instants. These are
aniposelib's triangulate_optim length constraints taken causally, one instant at a time; a fit
that leaves a joint more than one pixel_sigma_px past the triangulation's reprojection bound
(lengths the views cannot hold, e.g. another person's) is not kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from stages.rig.calibration import Camera
from stages.rig.quality import BONES
from stages.rig.triangulate import Triangulation

# the joints the bones join
JOINTS: tuple[int, ...] = tuple(sorted({k for _, a, b in BONES for k in (a, b)}))


@dataclass(frozen=True)
class BoneFitParams:
    """bone_sigma_m: how far a bone's keypoint-to-keypoint length may stray from its median
    at the cost of one pixel_sigma_px of reprojection; pixel_sigma_px: the 2D model's scatter
    (MediaPipe's on Pose2Sim's demo: 7-9 px median with a rig fitted to the same views,
    docs/benchmarks.md "demo_3d")."""

    bone_sigma_m: float = 0.02
    pixel_sigma_px: float = 8.0


def fit_bones(
    cameras: Sequence[Camera],
    observed: np.ndarray,
    tri: Triangulation,
    p: int,
    lengths: Mapping[str, float],
    params: BoneFitParams,
    max_error: float,
) -> int:
    """Person p of tri (points and error changed in place) fitted to `lengths` (bone name ->
    m; bones not named are free) from observed float [V, K, 3], in the views tri.used says
    each joint was triangulated from. Returns the joints moved: 0 when no bone with both ends
    triangulated has a length, or when the fit would leave a joint's mean reprojection error
    past max_error + pixel_sigma_px."""
    points = tri.points[p]
    have = [k for k in JOINTS if np.isfinite(points[k]).all()]
    bones = [
        (have.index(a), have.index(b), lengths[n])
        for n, a, b in BONES
        if n in lengths and a in have and b in have
    ]
    if not bones:
        return 0
    joint, view = np.nonzero(tri.used[p, have])  # one observation per (joint, view used)
    ext = np.stack([c.extrinsics for c in cameras])[view]  # [N, 3, 4]
    focal = np.stack([np.diag(c.matrix)[:2] for c in cameras])[view]  # [N, 2]
    keypoint = np.array(have)[joint]
    seen = np.empty((len(joint), 2))
    for v, cam in enumerate(cameras):
        at = view == v
        seen[at] = cam.normalize(observed[v, keypoint[at], :2])
    weight = observed[view, keypoint, 2][:, None] * focal / params.pixel_sigma_px
    a, b, target = (np.array(x) for x in zip(*bones, strict=True))

    def residuals(x: np.ndarray) -> np.ndarray:
        xyz = x.reshape(-1, 3)
        local = np.einsum("nij,nj->ni", ext[:, :, :3], xyz[joint]) + ext[:, :, 3]
        off = (local[:, :2] / local[:, 2:] - seen) * weight
        stretch = (np.linalg.norm(xyz[a] - xyz[b], axis=-1) - target) / params.bone_sigma_m
        return np.concatenate([off.ravel(), stretch])

    fitted = least_squares(residuals, points[have].ravel(), method="lm").x.reshape(-1, 3)
    local = np.einsum("nij,nj->ni", ext[:, :, :3], fitted[joint]) + ext[:, :, 3]
    if not (local[:, 2] > 0).all():
        return 0
    px = np.hypot(*((local[:, :2] / local[:, 2:] - seen) * focal).T)
    error = np.bincount(joint, px, len(have)) / np.bincount(joint, minlength=len(have))
    if not (error <= max_error + params.pixel_sigma_px).all():  # the lengths do not fit
        return 0
    points[have] = fitted
    tri.error[p, have] = error
    return len(have)
