from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from stages.body.rotations import matrix_to_rotvec, rotvec_to_matrix


def _rotvecs(rng, n):
    axes = rng.normal(size=(n, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    angles = np.concatenate(
        [[0.0, 1e-10, 1e-5, np.pi - 1e-6, np.pi - 2e-3], rng.uniform(0, np.pi, n - 5)]
    )
    return axes * angles[:, None]


def test_matrices_equal_scipys_from_zero_to_a_half_turn():
    v = _rotvecs(np.random.default_rng(0), 400)
    np.testing.assert_allclose(rotvec_to_matrix(v), Rotation.from_rotvec(v).as_matrix(), atol=1e-14)


def test_rotation_vectors_equal_scipys_from_zero_to_a_half_turn():
    v = _rotvecs(np.random.default_rng(1), 400)
    m = Rotation.from_rotvec(v).as_matrix()
    np.testing.assert_allclose(matrix_to_rotvec(m), Rotation.from_matrix(m).as_rotvec(), atol=1e-9)
