"""Left/right swaps of one view undone before triangulation: a 2D model that takes a person's
back for their front labels every side the other way round in that view only.

Each view of a person seen by three or more views is compared, as labelled and mirrored
(every left keypoint read as its right counterpart and back), with the 3D the other views
triangulate; the view is mirrored when the mirrored labels fit clearly better. Pose2Sim's
Pose2Sim/triangulation.py `triangulation_from_best_cameras` (`handle_LR_swap`) solves the same
problem keypoint by keypoint; this decides per view and person, from all sided keypoints at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npu.models.sapiens2.keypoints import NAMES
from stages.rig.calibration import Camera
from stages.rig.triangulate import MAX_ERROR_PX, MIN_CONFIDENCE, MIN_VIEWS, triangulate

MARGIN = 0.5  # mirror a view when its mirrored labels' median error is under half the labelled
MIN_SIDED = 6  # sided keypoints a view and the other views' 3D must share to decide
_SIDES = {"left": "right", "right": "left", "l": "r", "r": "l"}


def mirror_index(names: Sequence[str] = NAMES) -> np.ndarray:
    """int64 [K]: each keypoint's other-side counterpart (its name with the whole words left /
    right, l / r exchanged), or itself when it has none (the nose, the neck)."""
    index = {n: i for i, n in enumerate(names)}
    out = np.arange(len(names))
    for i, name in enumerate(names):
        mirrored = "_".join(_SIDES.get(word, word) for word in name.split("_"))
        if mirrored != name and mirrored in index:
            out[i] = index[mirrored]
    return out


MIRROR = mirror_index()


def unswap_views(
    cameras: Sequence[Camera],
    keypoints: np.ndarray,
    mirror: np.ndarray = MIRROR,
    min_confidence: float = MIN_CONFIDENCE,
    max_error: float = MAX_ERROR_PX,
    margin: float = MARGIN,
) -> tuple[np.ndarray, np.ndarray]:
    """keypoints float [V, P, K, 3] (x, y, score; NaN / low score where unseen), as
    stages.rig.triangulate takes them -> (the keypoints with each swapped view of a person
    mirrored, swapped bool [V, P]). Every view is judged against the others' 3D as given."""
    kp = np.asarray(keypoints, dtype=np.float64)
    n_views, n_people, n_kp, _ = kp.shape
    sided = np.flatnonzero(mirror[:n_kp] != np.arange(n_kp))
    seen = np.isfinite(kp).all(-1) & (kp[..., 2] >= min_confidence)
    swapped = np.zeros((n_views, n_people), bool)
    if n_views < MIN_VIEWS + 1 or not len(sided):
        return kp, swapped
    for v in range(n_views):
        others = [u for u in range(n_views) if u != v]
        rest = triangulate([cameras[u] for u in others], kp[others], min_confidence, max_error)
        points = rest.points[:, sided]  # [P, S, 3]
        made = np.isfinite(points).all(-1)
        projected = np.full(points.shape[:2] + (2,), np.nan)
        projected[made] = cameras[v].project(points[made])
        as_is = _median_distance(projected, kp[v][:, sided], seen[v][:, sided] & made)
        mirrored_kp = kp[v][:, mirror[sided]]
        flipped = _median_distance(projected, mirrored_kp, seen[v][:, mirror[sided]] & made)
        swapped[v] = flipped < margin * as_is
    out = kp.copy()
    for v, p in zip(*np.nonzero(swapped), strict=True):
        out[v, p] = kp[v, p][mirror[:n_kp]]
    return out, swapped


def _median_distance(projected: np.ndarray, observed: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per person, the median pixel distance over the masked keypoints; inf with fewer than
    MIN_SIDED of them (undecided: never mirrored)."""
    dist = np.linalg.norm(projected - observed[..., :2], axis=-1)
    dist = np.where(mask, dist, np.nan)
    enough = mask.sum(-1) >= MIN_SIDED
    out = np.full(len(dist), np.inf)
    if enough.any():
        out[enough] = np.nanmedian(dist[enough], axis=-1)
    return out
