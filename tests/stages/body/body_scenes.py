"""A synthetic ANNY person with known truth, seen by Pose2Sim's 4-camera demo calibration
(tests/stages/rig/data/pose2sim_Calib_qualisys.toml, converted from Pose2Sim's
Demo_SinglePerson Calib.qca.txt): walking through the capture volume while waving the
right arm, at 60 fps, its mapped keypoints projected into each camera with Gaussian pixel
noise and triangulated by stages/rig/triangulate.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from stages.body.fit import Pose
from stages.body.keypoint_map import BodyKeypoints
from stages.body.model import AnnyModel
from stages.rig.calibration import read_calibration
from stages.rig.triangulate import triangulate

CALIBRATION = Path(__file__).resolve().parents[1] / "rig" / "data" / "pose2sim_Calib_qualisys.toml"
FPS = 60.0
PHENOTYPE = np.array([0.3, 0.6, 0.45, 0.55, 0.7, 0.4])


def _bone_frame(model: AnnyModel, label: str, rotvec: np.ndarray) -> np.ndarray:
    """A delta (local-ref) from a rotation vector in the bone's own axes (limits.py)."""
    return Rotation.from_rotvec(model.reference[model.bone(label)] @ rotvec).as_matrix()


def walk_and_wave(model: AnnyModel, frames: int) -> list[Pose]:
    """Truth poses: a 1.1 s gait cycle (hips, knees, ankles, counter-swinging left arm,
    trunk twist) walking +x at 0.8 m/s through the middle of the rig, the right arm raised
    and waving at 2 Hz with its hand opening and closing, the left hand curled, the head
    turning; angles in the bones' own axes, inside the limits."""
    poses = []
    for f in range(frames):
        t = f / FPS
        gait = 2 * np.pi * t / 1.1
        wave = 2 * np.pi * 2.0 * t
        angles = {
            "upperleg01.L": (-0.35 * np.sin(gait), 0.0, 0.05),
            "upperleg01.R": (0.35 * np.sin(gait), 0.0, -0.05),
            "lowerleg01.L": (0.15 + 0.5 * (1 - np.cos(gait + 0.8)) / 2, 0.0, 0.0),
            "lowerleg01.R": (0.15 + 0.5 * (1 + np.cos(gait + 0.8)) / 2, 0.0, 0.0),
            "foot.L": (0.15 * np.sin(gait + 1.0), 0.0, 0.0),
            "foot.R": (-0.15 * np.sin(gait + 1.0), 0.0, 0.0),
            "spine03": (0.1, 0.15 * np.sin(gait), 0.03 * np.sin(gait)),
            "head": (0.1, 0.35 * np.sin(2 * np.pi * 0.5 * t), 0.0),
            "upperarm01.L": (0.35 * np.sin(gait), 0.0, -0.1),
            "lowerarm01.L": (0.3, 0.0, 0.0),
            "upperarm01.R": (0.3, 0.4, -1.9),
            "lowerarm01.R": (0.8 + 0.45 * np.sin(wave), 0.3, 0.0),
            "wrist.R": (0.2 * np.sin(wave), 0.0, 0.25 * np.sin(wave)),
            # the right hand opens and closes as it waves, the left stays half curled
            "finger1-1.R": (0.2 * np.sin(wave), 0.0, 0.3),
            "finger1-2.R": (0.0, 0.0, 0.3 + 0.3 * np.sin(wave)),
            "finger1-1.L": (0.1, 0.0, -0.2),
            "finger1-2.L": (0.0, 0.0, -0.4),
        }
        for n in range(2, 6):
            spread = 0.08 * (n - 3.5)
            angles[f"finger{n}-1.R"] = (0.5 + 0.5 * np.sin(wave + 0.2 * n), 0.0, spread)
            angles[f"finger{n}-2.R"] = (0.7 + 0.6 * np.sin(wave + 0.2 * n), 0.0, 0.0)
            angles[f"finger{n}-1.L"] = (0.6, 0.0, -spread)
            angles[f"finger{n}-2.L"] = (0.9, 0.0, 0.0)
        rotations = np.tile(np.eye(3), (model.bone_count, 1, 1))
        for label, rotvec in angles.items():
            rotations[model.bone(label)] = _bone_frame(model, label, np.array(rotvec))
        rotations[0] = Rotation.from_euler("z", 90, degrees=True).as_matrix()
        bob = 0.02 * np.cos(2 * gait)
        translation = np.array([-0.6 + 0.8 * t, 0.1, 0.93 + bob])
        poses.append(Pose(rotations, translation))
    return poses


@dataclass
class Observed:
    """truth [F, N, 3] and triangulated [F, N, 3] mapped points (m), the triangulated 308
    [F, 308, 3] and their confidence [F, 308] as rig3d publishes them."""

    truth: np.ndarray
    triangulated: np.ndarray
    points308: np.ndarray
    confidence308: np.ndarray


def observe(
    model: AnnyModel,
    phenotype: np.ndarray,
    poses: list[Pose],
    noise_px: float,
    seed: int,
    fingers: bool = False,
) -> Observed:
    """The mapped points (with fingers: the finger joints too) seen and triangulated."""
    cameras = list(read_calibration(CALIBRATION).cameras.values())
    mapped = BodyKeypoints(model, fingers)
    rest = model.rest(phenotype, vertices=False)
    anchors = mapped.anchors(rest)
    truth = np.stack(
        [
            np.einsum(
                "bij,nbj->ni",
                model.pose(rest, p.rotations, model.reference[0] @ p.translation).transforms,
                anchors,
            )
            for p in poses
        ]
    )
    rng = np.random.default_rng(seed)
    frames = len(poses)
    views = np.full((len(cameras), frames, 308, 3), np.nan)
    for v, cam in enumerate(cameras):
        pixels = cam.project(truth.reshape(-1, 3)).reshape(frames, len(mapped), 2)
        views[v][:, mapped.sapiens, :2] = pixels + rng.normal(0.0, noise_px, pixels.shape)
        views[v][:, mapped.sapiens, 2] = 0.9
    result = triangulate(cameras, views)
    return Observed(
        truth,
        result.points[:, mapped.sapiens],
        result.points,
        result.confidence.astype(np.float64),
    )
