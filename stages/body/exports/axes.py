"""npucam's Z-up world -> the Y-up frame of OpenSim, BVH and glTF readers: (x, y, z) ->
(y, z, x), the axis change Pose2Sim's make_trc applies (stages/rig/trc.py), a proper
rotation, so rotations map as M R M^T.
"""

from __future__ import annotations

import numpy as np

YUP_FROM_ZUP = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])


def points_yup(points: np.ndarray) -> np.ndarray:
    """[..., 3] Z-up points -> Y-up."""
    return np.asarray(points)[..., [1, 2, 0]]


def rotations_yup(rotations: np.ndarray) -> np.ndarray:
    """[..., 3, 3] rotations of the Z-up frame -> the same rotations in Y-up axes."""
    return YUP_FROM_ZUP @ np.asarray(rotations) @ YUP_FROM_ZUP.T
