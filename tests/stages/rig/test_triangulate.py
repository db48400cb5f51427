"""Triangulation with outlier-view rejection (stages/rig/triangulate.py) on synthetic scenes:
308-keypoint bodies ~3 m from 4 calibrated, distorting 1920x1080 cameras (rig_scenes.py),
1 px noise, one view per keypoint occluded or moved 80-300 px (at Pose2Sim's 15 px threshold
a view moved 80 px or more is always rejected in this geometry; docs/rig.md). The issue's
bound is a mean 3D error of 15 mm; at 1 px and f ~ 1250 px one view's ray is off ~2.4 mm at
3 m, so the mean lands near 3 mm. The reference for the linear solve is cv2.triangulatePoints.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from rig_scenes import corrupt, observe, people, ring_cameras

from stages.rig.triangulate import MAX_ERROR_PX, TriangulationError, triangulate


@pytest.mark.parametrize(("n_people", "seed"), [(1, 11), (2, 12), (3, 13)])
def test_people_triangulate_within_15mm_without_their_bad_views(n_people, seed):
    rng = np.random.default_rng(seed)
    cams = ring_cameras(rng)
    truth = people(rng, n_people)
    seen, occluded, wrong = corrupt(observe(cams, truth, rng), rng)
    dist = np.linalg.norm(truth.reshape(-1, 1, 3) - np.stack([c.centre for c in cams]), axis=-1)
    assert 2.0 < dist.mean() < 4.0  # "at 3 m"
    out = triangulate(cams, seen)
    err = np.linalg.norm(out.points - truth, axis=-1)
    assert not np.isnan(err).any()
    assert err.mean() <= 0.015
    used = out.used.transpose(2, 0, 1)  # [V, P, K] as the masks
    assert not (used & wrong).any(), "a moved view was kept"
    assert not (used & occluded).any(), "a low-confidence view was used"
    assert (used == ~(wrong | occluded)).all(), "a good view was dropped"
    assert (out.error < 4).all()  # px, in the undistorted image, for 1 px noise
    conf = np.where(used, seen[..., 2], 0).sum(0) / used.sum(0)
    assert np.allclose(out.confidence, conf, atol=1e-6)


def test_linear_solve_matches_cv2_triangulate_points():
    """Two views, equal confidences: cv2.triangulatePoints (homogeneous SVD) on the same
    normalized points gives the same point, exactly without noise and within 0.1 mm (0.03 of
    the error itself) with 1 px noise."""
    rng = np.random.default_rng(5)
    cams = ring_cameras(rng)[:2]
    truth = people(rng, 2)
    for noise, tol in ((0.0, 1e-9), (1.0, 1e-4)):
        seen = observe(cams, truth, rng, noise_px=noise)
        seen[..., 2] = 1.0
        out = triangulate(cams, seen, max_error=np.inf)
        norm = [c.normalize(seen[v, ..., :2].reshape(-1, 2)).T for v, c in enumerate(cams)]
        ref = cv2.triangulatePoints(cams[0].extrinsics, cams[1].extrinsics, *norm)
        ref = (ref[:3] / ref[3]).T
        assert np.abs(out.points.reshape(-1, 3) - ref).max() < tol


def test_ignored_views_change_nothing():
    """A view below min_confidence or NaN gives the result without that camera (to rounding:
    the normal equations sum one more zero term)."""
    rng = np.random.default_rng(7)
    cams = ring_cameras(rng)
    seen = observe(cams, people(rng, 1), rng)
    full = triangulate(cams[1:], seen[1:])
    low = seen.copy()
    low[0, ..., :2] = rng.uniform(0, 1000, low[0, ..., :2].shape)
    low[0, ..., 2] = 0.29
    nan = seen.copy()
    nan[0] = np.nan
    for variant in (low, nan):
        out = triangulate(cams, variant, min_confidence=0.3)
        assert np.abs(out.points - full.points).max() < 1e-12
        assert not out.used[..., 0].any()


def test_two_bad_views_of_five_are_both_left_out():
    rng = np.random.default_rng(8)
    cams = ring_cameras(rng, n=5)
    truth = people(rng, 1, keypoints=40)
    seen = observe(cams, truth, rng)
    seen[1, :, :, 0] += 150
    seen[3, :, :, 1] -= 120
    out = triangulate(cams, seen)
    assert (out.used[0] == [True, False, True, False, True]).all()
    assert np.linalg.norm(out.points - truth, axis=-1).max() < 0.02


def test_a_keypoint_that_never_gets_under_the_threshold_is_not_triangulated():
    """Two views only, one moved across the epipolar lines: no subset to try, so the point
    is left out (NaN, no views, NaN error), as Pose2Sim leaves it missing."""
    rng = np.random.default_rng(9)
    cams = ring_cameras(rng)[:2]
    seen = observe(cams, people(rng, 1, keypoints=20), rng)
    seen[1, 0, :10, 1] += 200  # the cameras are level: epipolar lines run roughly across
    assert (triangulate(cams, seen, max_error=np.inf).error[0, :10] > MAX_ERROR_PX).all()
    out = triangulate(cams, seen)
    assert np.isnan(out.points[0, :10]).all() and np.isnan(out.error[0, :10]).all()
    assert not out.used[0, :10].any() and (out.confidence[0, :10] == 0).all()
    assert not np.isnan(out.points[0, 10:]).any()


def test_keypoints_of_the_wrong_shape_are_refused():
    rng = np.random.default_rng(1)
    cams = ring_cameras(rng)
    with pytest.raises(TriangulationError, match=r"\[V=4, P, K, 3\].*\(3, 2, 308, 3\)"):
        triangulate(cams, np.zeros((3, 2, 308, 3)))
    with pytest.raises(TriangulationError, match="min_views must be at least 2"):
        triangulate(cams, np.zeros((4, 1, 5, 3)), min_views=1)


def test_no_people_gives_empty_results():
    cams = ring_cameras(np.random.default_rng(1))
    out = triangulate(cams, np.zeros((4, 0, 308, 3)))
    assert out.points.shape == (0, 308, 3) and out.used.shape == (0, 308, 4)
