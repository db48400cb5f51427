"""A synchronised rig's extrinsics from the 2D keypoints of people moving through it (no board),
each camera's lens given: relative poses per camera pair (cv2.findEssentialMat, cv2.recoverPose),
chained along a maximum spanning tree of the pairs' inliers, then a bundle adjustment of every
camera and keypoint (scipy.optimize.least_squares, sparse Jacobian, robust loss).

Observations: row n of every view is one instant and one person (same keypoint, same person,
same synchronised instant); each keypoint's 2D confidence weights its residual; the head's
points are left out (HEAD). A view's
left/right swaps are undone with the rig found so far (stages/rig/sides.py) before each
adjustment. The world is camera 0's frame (origin at its centre, x right, y down, z forward);
its scale comes from a stated body height (stages/rig/body_height.py) or a known distance
between two cameras.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import cv2
import numpy as np
from scipy.optimize import least_squares
from scipy.sparse import csr_matrix
from scipy.spatial.transform import Rotation

from npu.models.sapiens2.keypoints import NAMES
from stages.rig.body_height import body_height
from stages.rig.calibration import Calibration, CalibrationError, Camera
from stages.rig.sides import MIRROR, unswap_views
from stages.rig.triangulate import triangulate

MIN_CONFIDENCE = 0.5  # a keypoint under this 2D confidence is not an observation
MIN_PAIR_POINTS = 30  # matched keypoints a camera pair needs for an essential matrix
RANSAC_PX = 8.0  # the essential matrix's inlier threshold, px: ~the 2D model's error (8-14 px)
INIT_MAX_ERROR_PX = 40.0  # the initial rig triangulates with a loose rule; the loss does the rest
LOSS_SCALE_PX = 10.0  # soft_l1's inlier scale: residuals past it count as outliers
SWAP_ROUNDS = 2  # unswap + adjust, repeated: a better rig finds the swaps the first one missed
# Left out by default: the head's points are where the 2D model agrees least across views (a
# view from behind guesses the eyes and nose). On the Pose2Sim demo, with the hands: worst
# rotation 1.13 degrees with them, 0.82 without (docs/benchmarks.md, "people_calibration").
HEAD = ("nose", "left_eye", "right_eye", "left_ear", "right_ear")


@dataclass(frozen=True)
class PairPose:
    """Camera b's pose from camera a's frame (x_b = R x_a + t, |t| = 1) and how many matched
    keypoints agree with it."""

    a: int
    b: int
    rotation: np.ndarray  # float64 [3, 3]
    translation: np.ndarray  # float64 [3], unit length
    matched: int
    inliers: int


@dataclass(frozen=True)
class PeopleCalibration:
    """The calibrated rig and what it came from. scale: metres per unit of the adjusted rig;
    rms: px over the observations the robust loss kept (residual <= 3 x LOSS_SCALE_PX), per
    camera in camera_rms; swapped bool [V, N], the views mirrored before the last adjustment."""

    calibration: Calibration
    pairs: tuple[PairPose, ...]
    tree: tuple[tuple[int, int], ...]  # (placed camera, new camera), in the order placed
    camera_rms: tuple[float, ...]
    rms: float
    observations: int
    outliers: int
    swapped: np.ndarray
    scale: float
    scale_from: str


def calibrate_from_people(
    lenses: Sequence[Camera],
    keypoints: np.ndarray,
    height: float | None = None,
    distance: tuple[str, str, float] | None = None,
    names: Sequence[str] = NAMES,
    ignore: Sequence[str] = HEAD,
    mirror: np.ndarray = MIRROR,
    min_confidence: float = MIN_CONFIDENCE,
    bundle_adjust: bool = True,
) -> PeopleCalibration:
    """lenses: each camera's lens (matrix, distortions, size; its pose is ignored); keypoints
    float [V, N, K, 3] (x px, y px, confidence; NaN where unseen), row n of every view the same
    person at the same instant. Scale: `height` m of the person (or people: one height for all),
    or `distance` (camera name, camera name, metres between their centres); exactly one.
    names: the K keypoints' names (Sapiens2's 308 by default); those in `ignore` are not used."""
    kp = np.array(keypoints, dtype=np.float64)
    n_views = len(lenses)
    if kp.ndim != 4 or kp.shape[0] != n_views or kp.shape[3] != 3:
        raise CalibrationError(
            f"keypoints must be [V={n_views}, N, K, 3] (x, y, confidence per view), got {kp.shape}"
        )
    if n_views < 2:
        raise CalibrationError(f"extrinsics need at least 2 cameras, got {n_views}")
    _check_scale(lenses, height, distance)
    seen = np.isfinite(kp).all(-1) & (kp[..., 2] >= min_confidence)
    seen[:, :, [i for i, n in enumerate(names[: kp.shape[2]]) if n in ignore]] = False
    kp[~seen] = np.nan
    lenses = [replace(c, rotation=np.zeros(3), translation=np.zeros(3)) for c in lenses]
    normalized = _normalized(lenses, kp, seen)
    pairs = tuple(
        _pair_pose(a, b, normalized, seen, lenses)
        for a in range(n_views)
        for b in range(a + 1, n_views)
    )
    tree, rig = _initial_rig(lenses, pairs, normalized, kp)
    swapped = np.zeros(kp.shape[:2], bool)
    fit = None
    observed = kp
    if bundle_adjust:
        for _ in range(SWAP_ROUNDS):
            observed, swapped = unswap_views(rig, kp, mirror[: kp.shape[2]], min_confidence)
            fit = _bundle_adjust(rig, observed, tree[0][1])
            rig = fit.cameras
    points = fit.points if fit else _triangulated(rig, observed)
    scale, scale_from = _scale(rig, points, height, distance, names)
    cameras = {
        f"cam_{i + 1:02d}": replace(c, translation=c.translation * scale) for i, c in enumerate(rig)
    }
    sq = fit.squared if fit else [_squared(rig, observed, points, v) for v in range(n_views)]
    kept = [s[s <= (3 * LOSS_SCALE_PX) ** 2] for s in sq]
    all_kept = np.concatenate(kept)
    rms = float(np.sqrt(all_kept.mean())) if len(all_kept) else float("nan")
    camera_rms = tuple(float(np.sqrt(k.mean())) if len(k) else float("nan") for k in kept)
    n_obs = sum(len(s) for s in sq)
    return PeopleCalibration(
        Calibration(cameras, {"adjusted": bundle_adjust, "error": rms}),
        pairs,
        tree,
        camera_rms,
        rms,
        n_obs,
        n_obs - len(all_kept),
        swapped,
        scale,
        scale_from,
    )


def _normalized(lenses: Sequence[Camera], kp: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """float64 [V, N, K, 2]: each seen keypoint undistorted to normalized coordinates."""
    out = np.full(kp.shape[:3] + (2,), np.nan)
    for v, lens in enumerate(lenses):
        out[v][seen[v]] = lens.normalize(kp[v][seen[v]][:, :2])
    return out


def _pair_pose(
    a: int, b: int, normalized: np.ndarray, seen: np.ndarray, lenses: Sequence[Camera]
) -> PairPose:
    both = seen[a] & seen[b]
    matched = int(both.sum())
    if matched < MIN_PAIR_POINTS:
        return PairPose(a, b, np.eye(3), np.zeros(3), matched, 0)
    pa, pb = normalized[a][both], normalized[b][both]
    threshold = RANSAC_PX / np.sqrt(lenses[a].focal * lenses[b].focal)
    essential, mask = cv2.findEssentialMat(
        pa, pb, np.eye(3), method=cv2.RANSAC, prob=0.9999, threshold=threshold, maxIters=5000
    )
    if essential is None or essential.shape != (3, 3):
        return PairPose(a, b, np.eye(3), np.zeros(3), matched, 0)
    inliers, rot, t, _ = cv2.recoverPose(essential, pa, pb, np.eye(3), mask=mask)
    return PairPose(a, b, rot, t.ravel(), matched, int(inliers))


def _initial_rig(
    lenses: list[Camera], pairs: Sequence[PairPose], normalized: np.ndarray, kp: np.ndarray
) -> tuple[tuple[tuple[int, int], ...], list[Camera]]:
    """Camera poses along a maximum spanning tree of the pairs' inliers from camera 0 (Prim's):
    the first edge fixes the unit of length (its baseline = 1), each later camera's baseline
    is scaled so that its pair's 3D depths match the rig placed so far."""
    n_views = len(lenses)
    by_edge = {(p.a, p.b): p for p in pairs}
    pose = {0: (np.eye(3), np.zeros(3))}
    tree: list[tuple[int, int]] = []
    while len(pose) < n_views:
        inliers, a, b = max(
            (by_edge[min(a, b), max(a, b)].inliers, a, b)
            for a in pose
            for b in range(n_views)
            if b not in pose
        )
        if inliers < MIN_PAIR_POINTS:
            lost = [lenses[c].name for c in range(n_views) if c not in pose]
            raise CalibrationError(
                f"camera(s) {', '.join(map(repr, lost))} share too few keypoints with the rest "
                f"({inliers} agreeing, at least {MIN_PAIR_POINTS}): extrinsics need every camera "
                "to see the same people at the same instants as another camera"
            )
        r_ab, t_ab = _oriented(by_edge[min(a, b), max(a, b)], a)
        r_a, t_a = pose[a]
        if len(pose) == 1:
            scale = 1.0
        else:
            placed = [_posed(lenses[c], *pose[c]) for c in sorted(pose)]
            scale = _edge_scale(
                placed, sorted(pose), kp, normalized, a, b, r_ab, t_ab, r_a, t_a, lenses[b].name
            )
        pose[b] = (r_ab @ r_a, r_ab @ t_a + scale * t_ab)
        tree.append((a, b))
    rig = [_posed(lenses[c], *pose[c]) for c in range(n_views)]
    return tuple(tree), rig


def _oriented(pair: PairPose, a: int) -> tuple[np.ndarray, np.ndarray]:
    """The pair's pose as from camera a to the other one."""
    if pair.a == a:
        return pair.rotation, pair.translation
    return pair.rotation.T, -pair.rotation.T @ pair.translation


def _posed(lens: Camera, rot: np.ndarray, t: np.ndarray) -> Camera:
    return replace(lens, rotation=Rotation.from_matrix(rot).as_rotvec(), translation=t)


def _edge_scale(
    placed: list[Camera],
    order: list[int],
    kp: np.ndarray,
    normalized: np.ndarray,
    a: int,
    b: int,
    r_ab: np.ndarray,
    t_ab: np.ndarray,
    r_a: np.ndarray,
    t_a: np.ndarray,
    name: str,
) -> float:
    """The length of camera a -> b's baseline in the placed rig's unit: the median ratio of the
    depths in camera a of the keypoints both the placed rig and the pair (unit baseline)
    triangulate."""
    world = triangulate(placed, kp[order], max_error=INIT_MAX_ERROR_PX).points  # [N, K, 3]
    both = np.isfinite(world).all(-1) & np.isfinite(normalized[a]).all(-1)
    both &= np.isfinite(normalized[b]).all(-1)
    if not both.any():
        raise CalibrationError(
            f"camera {name!r}: no keypoint seen by the cameras placed before it and by it at "
            "once, so its distance is unknown"
        )
    pair = cv2.triangulatePoints(
        np.hstack([np.eye(3), np.zeros((3, 1))]),
        np.hstack([r_ab, t_ab[:, None]]),
        normalized[a][both].T,
        normalized[b][both].T,
    )
    depth_pair = pair[2] / pair[3]
    depth_rig = (world[both] @ r_a.T + t_a)[:, 2]
    ratio = depth_rig / depth_pair
    ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
    if not len(ratio):
        raise CalibrationError(f"camera {name!r}: no keypoint in front of both cameras of its pair")
    return float(np.median(ratio))


def _triangulated(rig: Sequence[Camera], kp: np.ndarray) -> np.ndarray:
    return triangulate(rig, kp, max_error=INIT_MAX_ERROR_PX).points


@dataclass(frozen=True)
class _Adjusted:
    cameras: list[Camera]
    points: np.ndarray  # float64 [N, K, 3], NaN where fewer than two views saw the keypoint
    squared: list[np.ndarray]  # per view: squared px residual of each observation


def _bundle_adjust(rig: list[Camera], kp: np.ndarray, first: int) -> _Adjusted:
    """Every camera pose but camera 0's (it fixes the frame) and every keypoint seen twice,
    minimising confidence-weighted reprojection error in undistorted pixels under soft_l1; the
    distance between camera 0 and camera `first` is held (it fixes the scale)."""
    n_views = len(rig)
    seen = np.isfinite(kp).all(-1)
    start = triangulate(rig, kp, max_error=INIT_MAX_ERROR_PX).points
    keep = (seen.sum(0) >= 2) & np.isfinite(start).all(-1)  # [N, K]
    point_of = np.full(keep.shape, -1)
    point_of[keep] = np.arange(keep.sum())
    obs_view, obs_n, obs_k = np.nonzero(seen & keep[None])  # in view order
    obs_point = point_of[obs_n, obs_k]
    obs = np.concatenate(
        [
            rig[v].normalize(kp[v, obs_n[obs_view == v], obs_k[obs_view == v], :2])
            for v in range(n_views)
        ]
    )
    conf = kp[obs_view, obs_n, obs_k, 2]
    focal = np.array([[c.matrix[0, 0], c.matrix[1, 1]] for c in rig])[obs_view]
    weight = np.sqrt(conf)[:, None] * focal
    n_cam = 6 * (n_views - 1)
    base = float(np.linalg.norm(rig[first].centre))

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cams = np.vstack([np.zeros((1, 6)), x[:n_cam].reshape(-1, 6)])
        return cams, x[n_cam:].reshape(-1, 3)

    def residuals(x: np.ndarray) -> np.ndarray:
        cams, pts = unpack(x)
        rot = Rotation.from_rotvec(cams[:, :3]).as_matrix()
        local = np.einsum("nij,nj->ni", rot[obs_view], pts[obs_point]) + cams[obs_view, 3:]
        off = (local[:, :2] / local[:, 2:] - obs) * weight
        centre = -rot[first].T @ cams[first, 3:]
        gauge = (np.linalg.norm(centre) - base) * focal[0, 0] * 100
        return np.append(off.ravel(), gauge)

    x0 = np.concatenate(
        [np.concatenate([c.rotation, c.translation]) for c in rig[1:]] + [start[keep].ravel()]
    )
    n_res = 2 * len(obs) + 1
    row = np.arange(2 * len(obs))
    view_of_row, point_of_row = np.repeat(obs_view, 2), np.repeat(obs_point, 2)
    free = view_of_row > 0
    rows = np.concatenate([np.repeat(row, 3), np.repeat(row[free], 6), np.full(6, n_res - 1)])
    cols = np.concatenate(
        [
            (n_cam + 3 * point_of_row[:, None] + np.arange(3)).ravel(),
            (6 * (view_of_row[free] - 1)[:, None] + np.arange(6)).ravel(),
            6 * (first - 1) + np.arange(6),
        ]
    )
    sparsity = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_res, len(x0)))
    fit = least_squares(
        residuals,
        x0,
        jac_sparsity=sparsity,
        method="trf",
        x_scale="jac",
        loss="soft_l1",
        f_scale=LOSS_SCALE_PX,
    )
    cams, pts = unpack(fit.x)
    cameras = [replace(c, rotation=cams[v, :3], translation=cams[v, 3:]) for v, c in enumerate(rig)]
    points = np.full(kp.shape[1:3] + (3,), np.nan)
    points[keep] = pts
    raw = (fit.fun[:-1].reshape(-1, 2) / np.sqrt(conf)[:, None]) ** 2
    sq = raw.sum(1)
    bounds = np.searchsorted(obs_view, np.arange(n_views + 1))
    return _Adjusted(cameras, points, [sq[bounds[v] : bounds[v + 1]] for v in range(n_views)])


def _squared(rig: Sequence[Camera], kp: np.ndarray, points: np.ndarray, v: int) -> np.ndarray:
    """Squared undistorted-px residuals of view v's observations of the triangulated points."""
    made = np.isfinite(points).all(-1) & np.isfinite(kp[v]).all(-1)
    cam = rig[v]
    local = points[made] @ cam.extrinsics[:, :3].T + cam.translation
    seen = cam.normalize(kp[v][made][:, :2])
    off = (local[:, :2] / local[:, 2:] - seen) * np.diag(cam.matrix)[:2]
    return (off**2).sum(1)


def _check_scale(
    lenses: Sequence[Camera], height: float | None, distance: tuple[str, str, float] | None
) -> None:
    if (height is None) == (distance is None):
        raise CalibrationError("scale: give exactly one of a body height or a camera distance")
    if height is not None and not (0.5 <= height <= 2.5):
        raise CalibrationError(f"height {height:g}: expected a person's height, 0.5-2.5 m")
    if distance is not None:
        first, second, metres = distance
        names = [c.name for c in lenses]
        for name in (first, second):
            if name not in names:
                known = ", ".join(map(repr, names))
                raise CalibrationError(f"distance: no camera {name!r} (the rig has {known})")
        if not (metres > 0 and np.isfinite(metres)) or first == second:
            raise CalibrationError(
                f"distance {first} {second} {metres:g}: two cameras and a positive distance"
            )


def _scale(
    rig: Sequence[Camera],
    points: np.ndarray,
    height: float | None,
    distance: tuple[str, str, float] | None,
    names: Sequence[str],
) -> tuple[float, str]:
    if distance is not None:
        first, second, metres = distance
        by_name = {c.name: c for c in rig}
        apart = float(np.linalg.norm(by_name[first].centre - by_name[second].centre))
        return metres / apart, f"{first}-{second} distance {metres:g} m"
    assert height is not None
    estimate = body_height(points, names)
    return height / estimate, f"body height {height:g} m"
