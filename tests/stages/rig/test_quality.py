"""Reprojection error and limb steadiness (stages/rig/quality.py) on points whose answer is
known: exact projections give 0 px, a moved 2D point its offset, a view whose 2D is shifted
one way that shift as its median offset, and a limb whose length alternates between two
values its coefficient of variation."""

from __future__ import annotations

import numpy as np

from npu.models.sapiens2.keypoints import INDEX
from stages.rig.calibration import Camera
from stages.rig.quality import (
    coefficient_of_variation,
    limb_lengths,
    reprojection_errors,
    reprojection_offsets,
)

CAM = Camera(
    "a",
    (640, 480),
    [[500, 0, 320], [0, 500, 240], [0, 0, 1]],
    [-0.1, 0.01, 0, 0],
    [0.0, 0.0, 0.0],
    [0.0, 0.0, 3.0],
)


def test_reprojection_error_is_the_2d_offset_where_masked():
    rng = np.random.default_rng(0)
    points = rng.uniform(-0.5, 0.5, (4, 308, 3))
    seen = CAM.project(points.reshape(-1, 3)).reshape(1, 4, 308, 2)
    seen[0, 1, 5] += (3.0, 4.0)
    mask = np.ones((1, 4, 308), bool)
    mask[0, 2] = False
    points[3, 7] = np.nan
    (errors,) = reprojection_errors([CAM], points, seen, mask)
    assert len(errors) == 3 * 308 - 1  # frame 2 masked out, one point not triangulated
    assert abs(np.sort(errors)[-1] - 5.0) < 1e-9  # the moved point: a 3-4-5 offset
    assert np.sort(errors)[-2] < 1e-9


def test_reprojection_offset_is_a_views_shift_not_its_scatter():
    rng = np.random.default_rng(1)
    points = rng.uniform(-0.5, 0.5, (6, 308, 3))
    exact = CAM.project(points.reshape(-1, 3)).reshape(6, 308, 2)
    scatter = rng.normal(0, 3.0, exact.shape)  # the 2D model's: no direction
    # view 0 the points shifted (-9, 4) px with scatter, view 1 scatter only, view 2 masked out
    seen = np.stack([exact + (-9.0, 4.0) + scatter, exact - scatter, exact])
    mask = np.ones((3, 6, 308), bool)
    mask[2] = False
    offsets = reprojection_offsets([CAM, CAM, CAM], points, seen, mask)
    np.testing.assert_allclose(offsets[0], (9.0, -4.0), atol=0.3)  # projected - seen
    np.testing.assert_allclose(offsets[1], (0.0, 0.0), atol=0.3)
    assert np.isnan(offsets[2]).all()
    # against the spread reprojection_errors gives the same view: 9.8 px of shift, not ~3
    errors = reprojection_errors([CAM, CAM, CAM], points, seen, mask)
    assert np.median(errors[0]) > 8.0 > 4.0 > np.median(errors[1])


def test_limb_cv_of_a_length_alternating_between_two_values():
    points = np.full((20, 308, 3), np.nan)
    points[:, INDEX["left_hip"]] = 0.0
    points[:, INDEX["left_knee"], 2] = np.tile([0.4, 0.5], 10)
    points[:, INDEX["left_knee"], :2] = 0.0
    thigh = limb_lengths(points)["left_thigh"]
    np.testing.assert_allclose(thigh, np.tile([0.4, 0.5], 10))
    assert abs(coefficient_of_variation(thigh) - 0.05 / 0.45) < 1e-12
    assert np.isnan(coefficient_of_variation(limb_lengths(points)["right_thigh"]))
