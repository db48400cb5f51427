"""Synthetic rig scenes with known truth: virtual cameras, rendered ChArUco views, skeletons.

Rendering follows each output pixel back through the camera: the lens inverse
(Camera.normalize, itself checked against cv2.projectPoints in test_calibration.py) gives its
ray, the board plane's homography gives the board point it hits, and cv2.remap samples the
board image drawn by cv2.aruco.CharucoBoard.generateImage there.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from stages.rig.board import Charuco, Checkerboard
from stages.rig.calibrate import BOARD_TO_WORLD
from stages.rig.calibration import Camera

BOARD = Charuco((7, 5), square_length=0.08, marker_length=0.06)
TEXTURE_PX_PER_M = 1500.0


def look_at(centre: np.ndarray, target: np.ndarray, up=(0.0, 0.0, 1.0)) -> tuple:
    """World -> camera (rvec [3], tvec [3]) of a camera at `centre` looking at `target`,
    image x to the right and y down, world z up."""
    z = np.asarray(target, float) - centre
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    x /= np.linalg.norm(x)
    rot = np.stack([x, np.cross(z, x), z])
    return cv2.Rodrigues(rot)[0].ravel(), -rot @ centre


def camera(name, centre, target, size, focal, rng, k1_range=(-0.15, 0.05)) -> Camera:
    """A pinhole camera with slightly anisotropic focal lengths, an offset principal point and
    OpenCV (k1, k2, p1, p2) distortion."""
    w, h = size
    matrix = np.array(
        [
            [focal, 0, w / 2 + rng.uniform(-20, 20)],
            [0, focal * 1.002, h / 2 + rng.uniform(-15, 15)],
            [0, 0, 1],
        ]
    )
    dist = [rng.uniform(*k1_range), rng.uniform(-0.05, 0.05)] + list(rng.uniform(-1e-3, 1e-3, 2))
    rvec, tvec = look_at(np.asarray(centre, float), target)
    return Camera(name, size, matrix, dist, rvec, tvec)


@dataclass
class BoardScene:
    cameras: list[Camera]  # truth, in the world calibrate_rig(world_view=0) defines
    images: list[list[np.ndarray]]  # [camera][capture] uint8 gray


def charuco_texture() -> tuple[np.ndarray, np.ndarray]:
    """BOARD as cv2 draws it at TEXTURE_PX_PER_M, and its board-frame origin in texture px."""
    w, h = (round(n * BOARD.square_length * TEXTURE_PX_PER_M) for n in BOARD.squares)
    return BOARD.opencv.generateImage((w, h), marginSize=0), np.zeros(2)


def checkerboard_texture(board: Checkerboard) -> tuple[np.ndarray, np.ndarray]:
    """The checkerboard with one white square of margin, and the texture px of its first inner
    corner (the origin of Checkerboard.object_points)."""
    cols, rows = board.corners
    cell = round(board.square_length * TEXTURE_PX_PER_M)
    squares = (np.indices((rows + 1, cols + 1)).sum(0) % 2 == 0).repeat(cell, 0).repeat(cell, 1)
    texture = np.pad(np.where(squares, 0, 255).astype(np.uint8), cell, constant_values=255)
    return texture, np.full(2, 2 * cell)


def board_scene(
    texture: tuple[np.ndarray, np.ndarray],
    board_size: tuple[float, float],
    n_cameras: int = 4,
    captures: int = 20,
    seed: int = 1,
    noise: float = 2.0,
) -> BoardScene:
    """Cameras 960x720 on an arc 1.4 m from the board's space, the board (width, height m) in
    `captures` poses (capture 0 facing the cameras, the rest tilted up to ~35 degrees and
    moved up to 0.4 m), images blurred (sigma 0.6 px) with Gaussian grey-level noise."""
    image, origin = texture
    rng = np.random.default_rng(seed)
    size = (960, 720)
    # board frame: x right, y down, z into the board; facing the cameras (at -y) means
    # board x -> world x, board y -> world -z, board z -> world +y
    facing = np.array([[1.0, 0, 0], [0, 0, 1], [0, -1, 0]])
    half = np.array([board_size[0] / 2, board_size[1] / 2, 0])
    poses = []
    for k in range(captures):
        tilt = np.zeros(3) if k == 0 else rng.uniform(-0.6, 0.6, 3)
        rot = cv2.Rodrigues(tilt)[0] @ facing
        centre = np.zeros(3) if k == 0 else rng.uniform([-0.4, -0.4, -0.3], [0.4, 0.3, 0.3])
        poses.append((rot, centre - rot @ half))
    scene_cams = []
    for i, azimuth in enumerate(np.deg2rad([-35, -12, 12, 35][:n_cameras])):
        centre = [1.4 * np.sin(azimuth), -1.4 * np.cos(azimuth), 0.15 * (i % 2)]
        scene_cams.append(camera(f"cam{i}", centre, np.zeros(3), size, rng.uniform(780, 900), rng))
    image = cv2.GaussianBlur(image, (0, 0), 1.0)  # band-limit before resampling
    w, h = size
    grid = np.stack(np.meshgrid(np.arange(w), np.arange(h)), -1).reshape(-1, 2)
    to_texture = np.array(
        [[TEXTURE_PX_PER_M, 0, origin[0] - 0.5], [0, TEXTURE_PX_PER_M, origin[1] - 0.5], [0, 0, 1]]
    )  # board metres -> texture pixel centres
    images = []
    for cam in scene_cams:
        rays = cam.normalize(grid).reshape(h, w, 2).astype(np.float32)
        r_c, t_c = cam.extrinsics[:, :3], cam.translation
        row = []
        for rot, t in poses:
            to_rays = np.column_stack([(r_c @ rot)[:, :2], r_c @ t + t_c])  # board plane -> rays
            maps = cv2.perspectiveTransform(rays, to_texture @ np.linalg.inv(to_rays))
            img = cv2.remap(
                image,
                maps[..., 0],
                maps[..., 1],
                cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_CONSTANT,
                borderValue=255,
            )
            img = cv2.GaussianBlur(img, (0, 0), 0.6) + rng.normal(0, noise, img.shape)
            row.append(np.clip(img, 0, 255).astype(np.uint8))
        images.append(row)
    # the truth in calibrate_rig's world of world_view=0: x_cam = R (R0 F x + t0) + t
    rot0, t0 = poses[0]
    rot0 = rot0 @ BOARD_TO_WORLD
    truth = [
        Camera(
            c.name,
            c.size,
            c.matrix,
            c.distortions,
            cv2.Rodrigues(c.extrinsics[:, :3] @ rot0)[0].ravel(),
            c.extrinsics[:, :3] @ t0 + c.translation,
        )
        for c in scene_cams
    ]
    return BoardScene(truth, images)


def ring_cameras(rng, n: int = 4, radius: float = 3.0, size=(1920, 1080)) -> list[Camera]:
    """n cameras on a circle of `radius` m at 1.6 m height, looking at (0, 0, 1) m, world z up."""
    cams = []
    for i in range(n):
        a = 2 * np.pi * i / n + rng.uniform(-0.2, 0.2)
        centre = [radius * np.cos(a), radius * np.sin(a), 1.6 + rng.uniform(-0.2, 0.2)]
        cams.append(
            camera(
                f"cam{i}",
                centre,
                [0, 0, 1.0],
                size,
                rng.uniform(1100, 1400),
                rng,
                k1_range=(-0.25, 0.1),
            )
        )
    return cams


def people(rng, n: int, keypoints: int = 308) -> np.ndarray:
    """float64 [n, keypoints, 3] m: one template body (points in a 0.5 x 0.3 x 1.8 m box, the
    same for everyone, as bodies share a shape) per person, jittered by 3 cm, turned by a
    random yaw and placed on the floor at least 0.6 m from the others within 0.8 m of the
    centre."""
    template = rng.uniform([-0.25, -0.15, 0.0], [0.25, 0.15, 1.8], (keypoints, 3))
    places: list[np.ndarray] = []
    while len(places) < n:
        p = rng.uniform(-0.8, 0.8, 2)
        if all(np.linalg.norm(p - q) >= 0.6 for q in places):
            places.append(p)
    out = []
    for p in places:
        yaw = rng.uniform(0, 2 * np.pi)
        rot = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
        body = (template + rng.normal(0, 0.03, template.shape)) @ rot.T
        out.append(body + [p[0], p[1], 0.0])
    return np.stack(out)


def observe(cams: list[Camera], points: np.ndarray, rng, noise_px: float = 1.0) -> np.ndarray:
    """float64 [V, P, K, 3]: each camera's (x, y, confidence) of points [P, K, 3], with
    Gaussian pixel noise and confidences in [0.6, 1]."""
    p, k, _ = points.shape
    out = np.empty((len(cams), p, k, 3))
    for v, cam in enumerate(cams):
        out[v, ..., :2] = cam.project(points.reshape(-1, 3)).reshape(p, k, 2)
    out[..., :2] += rng.normal(0, noise_px, out[..., :2].shape)
    out[..., 2] = rng.uniform(0.6, 1.0, (len(cams), p, k))
    return out


def corrupt(observed: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One view per (person, keypoint), at random, made occluded (confidence 0.1) or wrong
    (moved 80-300 px, confidence kept). Returns (observations, occluded, wrong), the masks
    bool [V, P, K]."""
    v, p, k, _ = observed.shape
    out = observed.copy()
    bad = rng.integers(0, v, (p, k))
    pick = np.arange(v)[:, None, None] == bad[None]
    wrong = pick & (rng.random((p, k)) < 0.5)[None]
    occluded = pick & ~wrong
    out[..., 2][occluded] = 0.1
    angle = rng.uniform(0, 2 * np.pi, wrong.sum())
    step = rng.uniform(80, 300, wrong.sum())
    out[..., 0][wrong] += step * np.cos(angle)
    out[..., 1][wrong] += step * np.sin(angle)
    return out, occluded, wrong


# A standing body (m; x forward, y to its left, z up from the floor), on the 308 layout's names.
_BODY = {
    "nose": (0.10, 0.0, 1.62),
    "eye": (0.08, 0.03, 1.66),
    "ear": (0.0, 0.07, 1.63),
    "shoulder": (0.0, 0.19, 1.45),
    "elbow": (0.0, 0.22, 1.15),
    "wrist": (0.03, 0.23, 0.88),
    "hip": (0.0, 0.10, 0.95),
    "knee": (0.02, 0.10, 0.52),
    "ankle": (0.0, 0.10, 0.09),
    "heel": (-0.05, 0.10, 0.03),
    "big_toe": (0.17, 0.08, 0.02),
    "small_toe": (0.15, 0.13, 0.02),
}
_LEG = ("knee", "ankle", "heel", "big_toe", "small_toe")
_ARM = ("elbow", "wrist")


def walking_body(frames: int, centre: np.ndarray, radius: float = 0.8) -> np.ndarray:
    """float64 [frames, K, 3] m (NaN but for the 23 body keypoints): one body walking a full
    circle of `radius` round `centre` (x, y) on the floor z = 0, legs and arms swinging
    (0.5 rad) about the hips and shoulders, two strides a lap."""
    from npu.models.sapiens2.keypoints import INDEX, NAMES

    out = np.full((frames, len(NAMES), 3), np.nan)
    for t in range(frames):
        phase = 2 * np.pi * t / frames
        swing = 0.5 * np.sin(2 * phase)
        heading = phase + np.pi / 2
        turn = np.array(
            [
                [np.cos(heading), -np.sin(heading), 0],
                [np.sin(heading), np.cos(heading), 0],
                [0, 0, 1],
            ]
        )
        place = np.array(
            [centre[0] + radius * np.cos(phase), centre[1] + radius * np.sin(phase), 0]
        )
        for side, sign in (("left", 1.0), ("right", -1.0)):
            for part, (x, y, z) in _BODY.items():
                point = np.array([x, sign * y, z])
                pivot, angle = None, 0.0
                if part in _LEG:
                    pivot, angle = np.array(_BODY["hip"]), sign * swing
                elif part in _ARM:
                    pivot, angle = np.array(_BODY["shoulder"]), -sign * swing
                if pivot is not None:  # swing about the body's y axis through the pivot
                    c, s = np.cos(angle), np.sin(angle)
                    dx, dz = point[0] - pivot[0], point[2] - pivot[2]
                    point[0], point[2] = pivot[0] + c * dx + s * dz, pivot[2] - s * dx + c * dz
                name = part if part == "nose" else f"{side}_{part}"
                out[t, INDEX[name]] = turn @ point + place
    return out
