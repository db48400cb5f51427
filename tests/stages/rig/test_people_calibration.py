"""stages/rig/people_calibration.py on a synthetic walk seen by the demo lab's real 4 cameras
(tests/stages/rig/data/pose2sim_Calib_qualisys.toml): the body's 23 keypoints projected through
each real lens with 1 px noise, 3% of observations replaced by random pixels, and camera 2's
left/right labels swapped on frames 20-39.

Measured (60 frames; the head's 5 points left out by default, so 18 of the 23 used): with
the bundle adjustment every centre within 2.1 mm and every rotation within 0.052 degrees of the
truth after the similarity alignment; the initial rig alone (no adjustment) is 20-50 mm and
0.51-1.43 degrees off. Bounds: 5 mm and 0.15 degrees, between the two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rig_scenes import walking_body

from stages.rig.calibration import CalibrationError, read_calibration
from stages.rig.people_calibration import calibrate_from_people
from stages.rig.rig_alignment import align_rigs
from stages.rig.sides import MIRROR

CALIB = Path(__file__).parent / "data" / "pose2sim_Calib_qualisys.toml"
CENTRE_M = 0.005
ROTATION_DEG = 0.15
SCENE_CENTRE = np.array([-0.9, 0.0])  # (x, y) m where the lab's four optical axes meet
SWAPPED = (1, slice(20, 40))  # camera 2, frames 20-39


@pytest.fixture(scope="module")
def truth():
    return list(read_calibration(CALIB).cameras.values())


@pytest.fixture(scope="module")
def walk(truth):
    rng = np.random.default_rng(0)
    points = walking_body(60, SCENE_CENTRE)
    made = np.isfinite(points).all(-1)
    obs = np.full((len(truth),) + points.shape, np.nan)
    for v, cam in enumerate(truth):
        obs[v][made, :2] = cam.project(points[made]) + rng.normal(0, 1.0, (made.sum(), 2))
        obs[v][made, 2] = rng.uniform(0.6, 1.0, made.sum())
    outlier = made[None] & (rng.random(obs.shape[:3]) < 0.03)
    obs[..., :2][outlier] = rng.uniform([0, 0], [1088, 1920], (outlier.sum(), 2))
    view, frames = SWAPPED
    obs[view, frames] = obs[view, frames][:, MIRROR]
    return obs


def _distance(truth, a: int = 0, b: int = 1) -> tuple[str, str, float]:
    return truth[a].name, truth[b].name, float(np.linalg.norm(truth[a].centre - truth[b].centre))


@pytest.fixture(scope="module")
def adjusted(truth, walk):
    return calibrate_from_people(truth, walk, distance=_distance(truth))


def test_recovers_the_real_rig_within_5mm_and_015_degrees(truth, adjusted):
    estimate = list(adjusted.calibration.cameras.values())
    alignment = align_rigs(estimate, truth)
    assert alignment.centre_error.max() < CENTRE_M, alignment.centre_error
    assert alignment.rotation_error.max() < ROTATION_DEG, alignment.rotation_error
    # the scale came from the true distance between cameras 1 and 2
    assert alignment.scale == pytest.approx(1.0, abs=0.005)
    # the world is camera 1's frame
    np.testing.assert_allclose(estimate[0].rotation, 0.0)
    np.testing.assert_allclose(estimate[0].translation, 0.0)
    assert [c.name for c in estimate] == [c.name for c in truth]
    for got, lens in zip(estimate, truth, strict=True):
        np.testing.assert_array_equal(got.matrix, lens.matrix)
        np.testing.assert_array_equal(got.distortions, lens.distortions)


def test_finds_the_swapped_view_and_only_it(adjusted, walk):
    expected = np.zeros(walk.shape[:2], bool)
    view, frames = SWAPPED
    expected[view, frames] = True
    np.testing.assert_array_equal(adjusted.swapped, expected)


def test_robust_loss_sets_the_random_pixels_aside(adjusted, walk):
    # 3% of ~5500 observations were replaced; their residuals are hundreds of px
    assert 0.02 * adjusted.observations < adjusted.outliers < 0.05 * adjusted.observations
    assert adjusted.rms < 3.5  # 1 px noise per axis, under the 3 x loss-scale cut


def test_without_the_bundle_adjustment_the_rig_misses_the_bounds(truth, walk):
    initial = calibrate_from_people(truth, walk, distance=_distance(truth), bundle_adjust=False)
    alignment = align_rigs(list(initial.calibration.cameras.values()), truth)
    assert alignment.centre_error.max() > CENTRE_M
    assert alignment.rotation_error.max() > ROTATION_DEG


def test_spanning_tree_reaches_every_camera_from_camera_1(adjusted):
    placed = [0] + [b for _, b in adjusted.tree]
    assert sorted(placed) == [0, 1, 2, 3]
    assert all(a in placed[: i + 1] for i, (a, _) in enumerate(adjusted.tree))
    for pair in adjusted.pairs:
        share = pair.inliers / pair.matched
        # 3% outliers in each view; camera 2's swapped frames cost it its sided keypoints there
        assert share > (0.6 if 1 in (pair.a, pair.b) else 0.9), (pair.a, pair.b, share)


def test_scale_from_a_stated_height_follows_the_height(truth, walk):
    tall = calibrate_from_people(truth, walk, height=1.8, bundle_adjust=False)
    short = calibrate_from_people(truth, walk, height=0.9, bundle_adjust=False)
    assert tall.scale == pytest.approx(2 * short.scale)
    assert "body height 1.8 m" in tall.scale_from


def test_a_camera_that_sees_no_one_is_named(truth, walk):
    blind = walk.copy()
    blind[2] = np.nan
    with pytest.raises(CalibrationError, match="cam_03"):
        calibrate_from_people(truth, blind, distance=_distance(truth), bundle_adjust=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"height": 1.7, "distance": ("cam_01", "cam_02", 1.0)}, "exactly one"),
        ({"distance": ("cam_01", "cam_09", 1.0)}, "no camera 'cam_09'"),
        ({"distance": ("cam_01", "cam_02", -1.0)}, "positive distance"),
        ({"height": 17.0}, "0.5-2.5 m"),
    ],
)
def test_bad_scale_arguments_are_refused_by_name(truth, walk, kwargs, message):
    with pytest.raises(CalibrationError, match=message):
        calibrate_from_people(truth, walk, bundle_adjust=False, **kwargs)


def test_keypoints_of_the_wrong_shape_are_refused(truth, walk):
    with pytest.raises(CalibrationError, match=r"\[V=4, N, K, 3\]"):
        calibrate_from_people(truth, walk[:3], height=1.7)
