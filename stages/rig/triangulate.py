"""Confidence-weighted linear triangulation of many keypoints at once, with outlier-view
rejection by reprojection error, as Pose2Sim's triangulation_from_best_cameras.

Each 2D keypoint is undistorted to normalized coordinates (Camera.normalize); its two DLT rows
(x P3 - P1, y P3 - P2 with P = [R | t]) are weighted by its confidence, as Pose2Sim's
weighted_triangulation; the system is solved in its inhomogeneous form (X4 = 1, Hartley &
Sturm's Linear-LS) by batched 3x3 normal equations. Reprojection errors are pixels of the
undistorted image. Rejection, Pose2Sim's rule: while the mean reprojection error over the
views used exceeds the threshold, try every subset with one more view left out, keep the one
with the least error, and stop when fewer than min_views would remain; a keypoint whose error
never gets under the threshold is not triangulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from pipeline.errors import NpucamError
from stages.rig.calibration import Camera

MIN_CONFIDENCE = 0.3  # Pose2Sim's likelihood_threshold_triangulation
MAX_ERROR_PX = 15.0  # Pose2Sim's reproj_error_threshold_triangulation
MIN_VIEWS = 2  # Pose2Sim's min_cameras_for_triangulation


class TriangulationError(NpucamError):
    """Keypoints or cameras triangulation cannot use; says which."""


@dataclass(frozen=True)
class Triangulation:
    """points float64 [P, K, 3] world (m), NaN where not triangulated; confidence float32
    [P, K], the mean of the views used (0 where none); error float32 [P, K], the mean
    reprojection error of the views used (undistorted px, NaN where not triangulated); used
    bool [P, K, V], the views each point was triangulated from."""

    points: np.ndarray
    confidence: np.ndarray
    error: np.ndarray
    used: np.ndarray


def triangulate(
    cameras: Sequence[Camera],
    keypoints: np.ndarray,
    min_confidence: float = MIN_CONFIDENCE,
    max_error: float = MAX_ERROR_PX,
    min_views: int = MIN_VIEWS,
) -> Triangulation:
    """keypoints: float [V, P, K, 3], view v's (x px, y px, confidence) of person p's keypoint
    k, NaN or confidence < min_confidence where not seen; the views in `cameras` order."""
    kp = np.asarray(keypoints, dtype=np.float64)
    n_views = len(cameras)
    if kp.ndim != 4 or kp.shape[0] != n_views or kp.shape[3] != 3:
        raise TriangulationError(
            f"keypoints must be [V={n_views}, P, K, 3] (x, y, confidence per view), got {kp.shape}"
        )
    if min_views < 2:
        raise TriangulationError(f"min_views must be at least 2, got {min_views}")
    _, n_people, n_kp, _ = kp.shape
    flat = kp.reshape(n_views, -1, 3)
    n = flat.shape[1]
    valid = np.isfinite(flat).all(-1) & (flat[..., 2] >= min_confidence) & (flat[..., 2] > 0)
    pixels = np.where(valid[..., None], flat[..., :2], 0.0)
    weight = np.where(valid, flat[..., 2], 0.0).T  # [N, V]
    ext = np.stack([c.extrinsics for c in cameras])  # [V, 3, 4]
    to_local = ext[:, :, :3].transpose(2, 0, 1).reshape(3, 3 * n_views)  # x @ it = R_v x, all v
    focal = np.stack([np.diag(c.matrix)[:2] for c in cameras])  # [V, 2] fx, fy
    seen = np.stack([c.normalize(pixels[v]) for v, c in enumerate(cameras)], 1)  # [N, V, 2]
    rows = seen[..., None] * ext[None, :, 2:3] - ext[None, :, :2]  # [N, V, 2, 4]
    outer = (rows.transpose(0, 1, 3, 2) @ rows).reshape(n, n_views, 16)  # per-view A^T A
    w2 = weight**2

    def solve(idx: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points idx [M] from the views in mask bool [M, V] -> (X [M, 3], error [M] px)."""
        normal = ((w2[idx] * mask)[:, None, :] @ outer[idx]).reshape(-1, 4, 4)
        lhs, rhs = normal[:, :3, :3], -normal[:, :3, 3:]
        try:
            x = np.linalg.solve(lhs, rhs)[..., 0]
        except np.linalg.LinAlgError:  # an exactly singular system: coincident rays
            x = (np.linalg.pinv(lhs) @ rhs)[..., 0]
        local = (x @ to_local).reshape(-1, n_views, 3) + ext[:, :, 3]  # [M, V, 3]
        with np.errstate(divide="ignore", invalid="ignore"):
            off = (local[..., :2] / local[..., 2:] - seen[idx]) * focal
        # a view the point would be behind scores inf; views not in mask score 0
        dist = np.where(local[..., 2] > 0, np.hypot(off[..., 0], off[..., 1]), np.inf)
        return x, np.where(mask, dist, 0.0).sum(1) / mask.sum(1)

    count = valid.sum(0)
    best_x = np.full((n, 3), np.nan)
    best_err = np.full(n, np.inf)
    used = np.zeros((n, n_views), bool)
    todo = np.flatnonzero(count >= min_views)
    if len(todo):
        best_x[todo], best_err[todo] = solve(todo, valid.T[todo])
        used[todo] = valid.T[todo]
    for k in range(1, n_views - min_views + 1):
        todo = np.flatnonzero((best_err > max_error) & (count - k >= min_views))
        if not len(todo):
            break
        drop = np.array([np.isin(np.arange(n_views), c) for c in combinations(range(n_views), k)])
        n_sub = len(drop)
        masks = (valid.T[todo, None, :] & ~drop[None]).reshape(-1, n_views)  # [M * S, V]
        # a subset leaves out k seen views; one that drops an unseen view repeats a lower level
        real = np.flatnonzero(masks.sum(1) == np.repeat(count[todo] - k, n_sub))
        x = np.full((len(masks), 3), np.nan)
        err = np.full(len(masks), np.inf)
        x[real], err[real] = solve(np.repeat(todo, n_sub)[real], masks[real])
        pick = np.arange(len(todo)) * n_sub + err.reshape(-1, n_sub).argmin(1)
        best_x[todo], best_err[todo], used[todo] = x[pick], err[pick], masks[pick]
    good = best_err <= max_error
    used &= good[:, None]
    n_used = used.sum(1)
    conf = np.divide((weight * used).sum(1), n_used, out=np.zeros(n), where=n_used > 0)
    return Triangulation(
        np.where(good[:, None], best_x, np.nan).reshape(n_people, n_kp, 3),
        conf.astype(np.float32).reshape(n_people, n_kp),
        np.where(good, best_err, np.nan).astype(np.float32).reshape(n_people, n_kp),
        used.reshape(n_people, n_kp, n_views),
    )
