"""Rotation vectors <-> matrices for batches, as scipy.spatial.transform.Rotation's
from_rotvec / as_rotvec (the reference in tests/stages/body/test_rotations.py) without its
per-call overhead, which dominated the fit's small batches. Rows within 1e-3 rad of a half
turn, where the skew part loses precision, go through scipy.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

_NEAR_HALF_TURN = np.pi - 1e-3


def rotvec_to_matrix(rotvecs: np.ndarray) -> np.ndarray:
    """float64 [n, 3] -> [n, 3, 3] (Rodrigues)."""
    v = np.asarray(rotvecs, dtype=np.float64)
    angle = np.linalg.norm(v, axis=-1)
    small = angle < 1e-8
    safe = np.where(small, 1.0, angle)
    a = np.where(small, 1.0 - angle**2 / 6.0, np.sin(angle) / safe)
    b = np.where(small, 0.5 - angle**2 / 24.0, (1.0 - np.cos(angle)) / safe**2)
    x, y, z = v[..., 0], v[..., 1], v[..., 2]
    k = np.zeros(v.shape[:-1] + (3, 3))
    k[..., 0, 1], k[..., 0, 2], k[..., 1, 2] = -z, y, -x
    k[..., 1, 0], k[..., 2, 0], k[..., 2, 1] = z, -y, x
    return np.eye(3) + a[..., None, None] * k + b[..., None, None] * (k @ k)


def matrix_to_rotvec(matrices: np.ndarray) -> np.ndarray:
    """float64 [n, 3, 3] rotations -> [n, 3] rotation vectors, angles in [0, pi]."""
    m = np.asarray(matrices, dtype=np.float64)
    cos = np.clip((np.trace(m, axis1=-2, axis2=-1) - 1.0) / 2.0, -1.0, 1.0)
    angle = np.arccos(cos)
    skew = np.stack(
        [m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]], -1
    )
    sin = np.sin(angle)
    scale = np.where(
        angle < 1e-8, 0.5 + angle**2 / 12.0, angle / (2.0 * np.where(sin == 0, 1.0, sin))
    )
    out = scale[..., None] * skew
    far = angle > _NEAR_HALF_TURN
    if far.any():
        out[far] = Rotation.from_matrix(m[far]).as_rotvec()
    return out
