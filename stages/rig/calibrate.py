"""Rig calibration from board views: intrinsics per camera, extrinsics chained through shared
views, then a bundle adjustment of every extrinsic and board pose.

Intrinsics: cv2.calibrateCamera on one camera's views (k3 fixed at 0 by default, as Pose2Sim's
calibration does). Extrinsics: board poses per view (cv2.solvePnP, IPPE for a planar target),
camera-to-camera poses along a maximum spanning tree of the shared-view graph from camera 0,
then scipy.optimize.least_squares (TRF, sparse Jacobian) over all camera and board poses,
minimizing the reprojection error in pixels with the intrinsics held.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np
from scipy.optimize import least_squares
from scipy.sparse import csr_matrix
from scipy.spatial.transform import Rotation

from stages.rig.board import Board, BoardView, Charuco
from stages.rig.calibration import Calibration, CalibrationError, Camera

MIN_INTRINSIC_VIEWS = 3  # Zhang's method needs 3 views of a plane for a full camera matrix
MAX_IMAGES = 5000  # per camera
BOARD_TO_WORLD = np.diag([1.0, -1.0, -1.0])  # the world of world_view, in board coordinates


@dataclass(frozen=True)
class CameraViews:
    """One camera's board views: views[f] is the board in capture f (None if not found); the
    f-th capture of every camera of a rig is the same instant."""

    name: str
    size: tuple[int, int]  # (width, height) in pixels
    views: tuple[BoardView | None, ...]


@dataclass(frozen=True)
class Intrinsics:
    matrix: np.ndarray  # float64 [3, 3]
    distortions: np.ndarray  # float64 [4] (k1, k2, p1, p2) or [5] with k3
    rms: float  # px, cv2.calibrateCamera's reprojection error
    views: int


@dataclass(frozen=True)
class CameraReport:
    name: str
    intrinsic_views: int
    intrinsic_rms: float  # px
    shared_views: int  # views in the bundle adjustment: board seen by another camera too
    rms: float  # px, reprojection error after the bundle adjustment


@dataclass(frozen=True)
class RigCalibration:
    calibration: Calibration
    cameras: tuple[CameraReport, ...]
    rms: float  # px, over every observation of the bundle adjustment


def detect_views(
    board: Board, name: str, images: Iterable[np.ndarray], max_images: int = MAX_IMAGES
) -> CameraViews:
    """Find the board in each of one camera's images (uint8 gray or BGR, one size)."""
    size: tuple[int, int] | None = None
    views = []
    for i, image in enumerate(images):
        if i >= max_images:
            raise CalibrationError(f"camera {name!r}: more than {max_images} images")
        try:
            views.append(board.detect(image))
        except CalibrationError as exc:
            raise CalibrationError(f"camera {name!r} image {i}: {exc}") from None
        h, w = np.shape(image)[:2]
        if size is None:
            size = (w, h)
        elif (w, h) != size:
            raise CalibrationError(
                f"camera {name!r}: image {i} is {w}x{h} but image 0 is {size[0]}x{size[1]}; "
                "one camera's images must all have one size"
            )
    if size is None:
        raise CalibrationError(f"camera {name!r}: no images")
    return CameraViews(name, size, tuple(views))


def calibrate_intrinsics(board: Board, cam: CameraViews, fix_k3: bool = True) -> Intrinsics:
    """Camera matrix and distortion of one camera from its board views."""
    found = [v for v in cam.views if v is not None]
    if not found:
        raise CalibrationError(
            f"camera {cam.name!r}: the board was not found in any of its {len(cam.views)} images"
        )
    if len(found) < MIN_INTRINSIC_VIEWS:
        raise CalibrationError(
            f"camera {cam.name!r}: the board was found in {len(found)} of {len(cam.views)} "
            f"images; intrinsics need at least {MIN_INTRINSIC_VIEWS} views of it at different "
            "angles (10-20 are better)"
        )
    obj = [board.object_points[v.ids].astype(np.float32) for v in found]
    img = [v.image_points.astype(np.float32) for v in found]
    flags = cv2.CALIB_FIX_K3 if fix_k3 else 0
    try:
        rms, matrix, dist, _, _ = cv2.calibrateCamera(obj, img, cam.size, None, None, flags=flags)
    except cv2.error as exc:
        raise CalibrationError(
            f"camera {cam.name!r}: cv2.calibrateCamera failed: {exc.err}"
        ) from None
    return Intrinsics(matrix, dist.ravel()[: 4 if fix_k3 else 5], float(rms), len(found))


def _board_pose(board: Board, view: BoardView, intr: Intrinsics) -> tuple[np.ndarray, np.ndarray]:
    """Board -> camera (R [3, 3], t [3]) of one view."""
    _, rvec, tvec = cv2.solvePnP(
        board.object_points[view.ids],
        view.image_points,
        intr.matrix,
        intr.distortions,
        flags=cv2.SOLVEPNP_IPPE,
    )
    return cv2.Rodrigues(rvec)[0], tvec.ravel()


def _medoid(poses: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The pose whose rotation is nearest all others (sum of chordal distances): robust to the
    occasional flipped IPPE solution, which an average would not be."""
    rots = np.stack([r for r, _ in poses])
    dist = np.linalg.norm(rots[:, None] - rots[None], axis=(2, 3)).sum(1)
    return poses[int(np.argmin(dist))]


def calibrate_rig(
    board: Board,
    cameras: Sequence[CameraViews],
    intrinsics: Sequence[Intrinsics] | None = None,
    world_view: int | None = None,
    fix_k3: bool = True,
) -> RigCalibration:
    """Calibrate a rig. The world frame is camera 0's, or with `world_view` = f the board's in
    capture f: origin at its first corner, x along its corner rows, z out of its face (y =
    -board y), metres as the board's lengths."""
    if not isinstance(board, Charuco):
        raise CalibrationError(
            "extrinsics need a ChArUco board: a checkerboard's corners have no identity under "
            "a half turn, so two cameras may number them differently"
        )
    names = [c.name for c in cameras]
    if len(cameras) < 2 or len(set(names)) != len(names):
        raise CalibrationError(f"a rig needs at least 2 cameras with distinct names, got {names}")
    if intrinsics is None:
        intrinsics = [calibrate_intrinsics(board, c, fix_k3) for c in cameras]
    elif len(intrinsics) != len(cameras):
        raise CalibrationError(f"{len(intrinsics)} intrinsics for {len(cameras)} cameras")
    pose = {
        (c, f): _board_pose(board, v, intrinsics[c])
        for c, cam in enumerate(cameras)
        for f, v in enumerate(cam.views)
        if v is not None
    }
    seen: dict[int, list[int]] = {}  # capture -> the cameras that see the board in it
    for c, f in pose:
        seen.setdefault(f, []).append(c)
    if world_view is not None and world_view not in seen:
        raise CalibrationError(f"world_view {world_view}: no camera sees the board in that view")
    cam_pose = _camera_tree(pose, seen, names)
    ba_views = sorted(f for f, cs in seen.items() if len(cs) >= 2 or f == world_view)
    board_pose = []  # board -> camera 0, the medoid of what each camera saw
    for f in ba_views:
        guesses = []
        for c in seen[f]:
            (r_c, t_c), (r_bc, t_bc) = cam_pose[c], pose[c, f]
            guesses.append((r_c.T @ r_bc, r_c.T @ (t_bc - t_c)))
        board_pose.append(_medoid(guesses))
    lenses = [
        Camera(c.name, c.size, i.matrix, i.distortions, np.zeros(3), np.zeros(3))
        for c, i in zip(cameras, intrinsics, strict=True)
    ]
    obs = sorted(
        ((c, i, cameras[c].views[f]) for i, f in enumerate(ba_views) for c in seen[f]),
        key=lambda o: o[:2],
    )
    cams, boards, sq = _bundle_adjust(board, lenses, obs, cam_pose, board_pose)

    r_world, t_world = np.eye(3), np.zeros(3)  # world -> camera 0
    if world_view is not None:
        b = boards[ba_views.index(world_view)]
        # board x, y flipped to x, -y: z then points out of the board's face, up for a board
        # lying on the floor (Pose2Sim turns its board frame the same way)
        r_world, t_world = Rotation.from_rotvec(b[:3]).as_matrix() @ BOARD_TO_WORLD, b[3:]
    out, reports = {}, []
    for c, (lens, intr) in enumerate(zip(lenses, intrinsics, strict=True)):
        r_c = Rotation.from_rotvec(cams[c, :3]).as_matrix()
        out[f"cam_{c + 1:02d}"] = Camera(
            lens.name,
            lens.size,
            intr.matrix,
            intr.distortions,
            Rotation.from_matrix(r_c @ r_world).as_rotvec(),
            r_c @ t_world + cams[c, 3:],
        )
        shared = [len(v.ids) for cc, _, v in obs if cc == c]
        reports.append(
            CameraReport(lens.name, intr.views, intr.rms, len(shared), float(np.sqrt(sq[c].mean())))
        )
    rms = float(np.sqrt(np.concatenate(sq).mean()))
    return RigCalibration(Calibration(out, {"adjusted": True, "error": rms}), tuple(reports), rms)


def _camera_tree(pose: dict, seen: dict[int, list[int]], names: list[str]) -> dict:
    """Camera 0 -> camera c poses (R, t) along a maximum spanning tree of the shared-view graph
    (Prim's), each edge the medoid of the relative poses its shared views give."""
    n_cams = len(names)
    cam_pose = {0: (np.eye(3), np.zeros(3))}
    while len(cam_pose) < n_cams:
        count, a, b = max(
            (sum(a in cs and b in cs for cs in seen.values()), a, b)
            for a in cam_pose
            for b in range(n_cams)
            if b not in cam_pose
        )
        if count == 0:
            lost = [names[c] for c in range(n_cams) if c not in cam_pose]
            linked = [names[c] for c in cam_pose]
            raise CalibrationError(
                f"camera(s) {', '.join(map(repr, lost))} share no view of the board with "
                f"{', '.join(map(repr, linked))}: extrinsics need every camera linked to "
                f"{names[0]!r} through views where two cameras see the board at once"
            )
        rel = []
        for f, cs in seen.items():
            if a in cs and b in cs:
                (ra, ta), (rb, tb) = pose[a, f], pose[b, f]
                rel.append((rb @ ra.T, tb - rb @ ra.T @ ta))  # a -> b
        r_ab, t_ab = _medoid(rel)
        r_a, t_a = cam_pose[a]
        cam_pose[b] = (r_ab @ r_a, r_ab @ t_a + t_ab)
    return cam_pose


def _bundle_adjust(board: Board, lenses: list[Camera], obs: list, cam_pose: dict, board_pose):
    """Refine every camera pose but camera 0's (it fixes the gauge) and every board pose.
    obs: (camera, board index, BoardView), sorted by camera. Returns camera poses [C, 6] and
    board poses [B, 6] (rotation vector, translation) and each camera's squared residuals."""
    n_cams = len(lenses)
    obs_cam = np.concatenate([np.full(len(v.ids), c) for c, _, v in obs])
    obs_board = np.concatenate([np.full(len(v.ids), i) for _, i, v in obs])
    obj = np.concatenate([board.object_points[v.ids] for _, _, v in obs])
    img = np.concatenate([v.image_points for _, _, v in obs])
    bounds = np.searchsorted(obs_cam, np.arange(n_cams + 1))
    n_cam_params = 6 * (n_cams - 1)

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cams = np.vstack([np.zeros((1, 6)), x[:n_cam_params].reshape(-1, 6)])
        return cams, x[n_cam_params:].reshape(-1, 6)

    def residuals(x: np.ndarray) -> np.ndarray:
        cams, boards = unpack(x)
        r_cam = Rotation.from_rotvec(cams[:, :3]).as_matrix()
        r_board = Rotation.from_rotvec(boards[:, :3]).as_matrix()
        world = np.einsum("nij,nj->ni", r_board[obs_board], obj) + boards[obs_board, 3:]
        local = np.einsum("nij,nj->ni", r_cam[obs_cam], world) + cams[obs_cam, 3:]
        proj = np.concatenate(
            [lens.project(local[bounds[c] : bounds[c + 1]]) for c, lens in enumerate(lenses)]
        )
        return (proj - img).ravel()

    def params(poses) -> list[np.ndarray]:
        return [np.concatenate([Rotation.from_matrix(r).as_rotvec(), t]) for r, t in poses]

    x0 = np.concatenate(params([cam_pose[c] for c in range(1, n_cams)]) + params(board_pose))
    # each residual row depends on its board pose and, but for camera 0, its camera pose
    row = np.arange(2 * len(obj))
    cam_of_row, board_of_row = np.repeat(obs_cam, 2), np.repeat(obs_board, 2)
    free = cam_of_row > 0
    cols = np.concatenate(
        [
            (n_cam_params + 6 * board_of_row[:, None] + np.arange(6)).ravel(),
            (6 * (cam_of_row[free] - 1)[:, None] + np.arange(6)).ravel(),
        ]
    )
    rows = np.concatenate([np.repeat(row, 6), np.repeat(row[free], 6)])
    sparsity = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(row), len(x0)))
    fit = least_squares(residuals, x0, jac_sparsity=sparsity, method="trf", x_scale="jac")
    sq = (fit.fun.reshape(-1, 2) ** 2).sum(1)
    cams, boards = unpack(fit.x)
    return cams, boards, [sq[bounds[c] : bounds[c + 1]] for c in range(n_cams)]
