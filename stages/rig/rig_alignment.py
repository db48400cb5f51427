"""How far one calibrated rig is from another of the same cameras, up to a similarity: the
Umeyama alignment of the camera centres (cv2.estimateAffine3D with force_rotation: rotation,
uniform scale, translation) maps the estimate onto the reference; then each camera's centre
distance and the angle between its rotations, in the reference's frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
from scipy.spatial.transform import Rotation

from stages.rig.calibration import CalibrationError, Camera


@dataclass(frozen=True)
class RigAlignment:
    """x_reference = scale * rotation @ x_estimate + translation; per camera (the estimate's
    order) centre_error in the reference's unit and rotation_error in degrees."""

    scale: float
    rotation: np.ndarray  # float64 [3, 3]
    translation: np.ndarray  # float64 [3]
    centre_error: np.ndarray  # float64 [C]
    rotation_error: np.ndarray  # float64 [C], degrees


def align_rigs(estimate: Sequence[Camera], reference: Sequence[Camera]) -> RigAlignment:
    """The two rigs' cameras in the same order (at least 3, not on one line)."""
    if len(estimate) != len(reference) or len(estimate) < 3:
        raise CalibrationError(
            f"align_rigs: {len(estimate)} and {len(reference)} cameras; the same 3 or more needed"
        )
    ours = np.array([c.centre for c in estimate])
    theirs = np.array([c.centre for c in reference])
    transform, scale = cv2.estimateAffine3D(ours, theirs, force_rotation=True)
    rotation, translation = transform[:, :3], transform[:, 3]
    centre_error = np.linalg.norm(scale * ours @ rotation.T + translation - theirs, axis=1)
    angles = [
        Rotation.from_matrix(e.extrinsics[:, :3] @ rotation.T @ r.extrinsics[:, :3].T).magnitude()
        for e, r in zip(estimate, reference, strict=True)
    ]
    return RigAlignment(
        float(scale), rotation, translation, centre_error, np.degrees(np.array(angles))
    )
