"""The body fit on a synthetic ANNY person (tests/stages/body/body_scenes.py): walking and
waving, its mapped keypoints seen by Pose2Sim's 4 demo cameras with 1 px noise and
triangulated, then fitted frame by frame."""

from __future__ import annotations

import numpy as np
import pytest
from body_scenes import PHENOTYPE, observe, walk_and_wave
from scipy.spatial.transform import Rotation

from stages.body.fit import FINGER_BONES, FITTED_BONES, BodyFitError, BodyTracker, FitConfig

FRAMES = 60


def _angle_errors(model, fits, truth, fitted=FITTED_BONES) -> np.ndarray:
    """[F, bones] degrees between the fitted and true pose deltas of the root and the
    fitted bones."""
    bones = [0] + [model.bone(b) for b in fitted]
    return np.array(
        [
            [
                np.degrees(Rotation.from_matrix(f.pose.rotations[b].T @ t.rotations[b]).magnitude())
                for b in bones
            ]
            for f, t in zip(fits, truth, strict=True)
        ]
    )


@pytest.fixture(scope="module")
def walk(body_model):
    truth = walk_and_wave(body_model, FRAMES)
    return truth, observe(body_model, PHENOTYPE, truth, noise_px=1.0, seed=0)


def test_walking_and_waving_is_tracked_within_5_degrees_and_the_triangulations_error(
    body_model, walk
):
    truth, seen = walk
    tracker = BodyTracker(body_model)
    fits = [tracker.update(seen.points308[f], seen.confidence308[f]) for f in range(FRAMES)]
    window = tracker.config.window
    assert [f.phenotype_final for f in fits] == [False] * (window - 1) + [True] * (
        FRAMES - window + 1
    )
    assert np.median(_angle_errors(body_model, fits, truth)) <= 5.0
    fitted = np.stack([f.keypoints for f in fits])
    fit_error = np.linalg.norm(fitted - seen.truth, axis=-1)
    tri_error = np.linalg.norm(seen.triangulated - seen.truth, axis=-1)
    # once the phenotype is held: the mean over every mapped keypoint and frame
    assert fit_error[window:].mean() <= 1.2 * tri_error[window:].mean()
    # over the whole sequence, the window's provisional phenotype included: the median
    assert np.median(fit_error) <= 1.2 * np.median(tri_error)
    # the phenotype is held, so every frame's bones have the same lengths
    rest_heads = [body_model.rest(f.phenotype, vertices=False).heads for f in fits[window - 1 :]]
    assert all(np.array_equal(h, rest_heads[0]) for h in rest_heads)
    # no joint outside its limits, up to the rotation-vector round trip's round-off
    limits = tracker.solver.limits
    for f in fits:
        assert limits.violation(f.pose.rotations[limits.bones]).max() <= 1e-12


def test_with_fingers_the_hands_are_tracked_once_the_phenotype_is_held(body_model, walk):
    truth, _ = walk
    seen = observe(body_model, PHENOTYPE, truth, noise_px=1.0, seed=0, fingers=True)
    tracker = BodyTracker(body_model, FitConfig(fingers=True))
    assert len(tracker.points) == 53 and tracker.points.finger.sum() == 20
    fits = [tracker.update(seen.points308[f], seen.confidence308[f]) for f in range(FRAMES)]
    window = tracker.config.window
    # the right hand opens and closes as it waves, the left stays curled
    errors = _angle_errors(body_model, fits, truth, FINGER_BONES)[window:, 1:]
    assert np.median(errors) <= 5.0
    fitted = np.stack([f.keypoints for f in fits])
    fit_error = np.linalg.norm(fitted - seen.truth, axis=-1)[window:]
    tri_error = np.linalg.norm(seen.triangulated - seen.truth, axis=-1)[window:]
    hand, body = tracker.points.finger, ~tracker.points.finger
    assert fit_error[:, hand].mean() <= 1.2 * tri_error[:, hand].mean()
    assert fit_error[:, body].mean() <= 1.2 * tri_error[:, body].mean()
    limits = tracker.solver.limits
    for f in fits:
        assert limits.violation(f.pose.rotations[limits.bones]).max() <= 1e-12


def test_missing_and_wrong_keypoints_are_ridden_over(body_model, walk):
    truth, seen = walk
    rng = np.random.default_rng(7)
    points = seen.points308.copy()
    mapped = BodyTracker(body_model).points.sapiens
    for f in range(FRAMES):
        gone, wrong = rng.choice(mapped, 4, replace=False), rng.choice(mapped, 2, replace=False)
        points[f, gone] = np.nan
        points[f, wrong] += rng.normal(0.0, 0.3, (2, 3))
    tracker = BodyTracker(body_model)
    fits = [tracker.update(points[f], seen.confidence308[f]) for f in range(FRAMES)]
    assert np.median(_angle_errors(body_model, fits, truth)) <= 5.0
    fitted = np.stack([f.keypoints for f in fits])
    assert np.median(np.linalg.norm(fitted - seen.truth, axis=-1)) <= 0.005
    # the residual is reported where there was a target, and NaN where there was none
    missing = ~np.isfinite(points[:, mapped]).all(axis=-1)
    residuals = np.stack([f.residuals for f in fits])
    assert np.array_equal(np.isnan(residuals), missing)


def test_a_frame_with_too_few_keypoints_is_not_fitted_and_bad_input_is_named(body_model, walk):
    _, seen = walk
    tracker = BodyTracker(body_model, FitConfig(min_points=8))
    few = np.full((308, 3), np.nan)
    assert tracker.update(few, np.ones(308)) is None
    assert tracker.pose is None
    with pytest.raises(BodyFitError, match=r"\[308, 3\].*\(17, 3\)"):
        tracker.update(np.zeros((17, 3)), np.ones(17))
