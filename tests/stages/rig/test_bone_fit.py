"""The bone-length fit (stages/rig/bone_fit.py) on a synthetic walk whose bones keep their
lengths (rig_scenes.walking_body, 4 ring cameras ~3 m away): with 2D as scattered as a landmark
model's (6 px), fitting the limb joints to the lengths kept so far brings them closer to the
truth and their lengths steadier than triangulation alone; lengths the views cannot hold are
not forced on them.
"""

from __future__ import annotations

import numpy as np
import pytest
from rig_scenes import observe, ring_cameras, walking_body

from stages.rig.bone_fit import JOINTS, BoneFitParams, fit_bones
from stages.rig.consistency import ConsistencyParams, hold_clip
from stages.rig.quality import BONES, coefficient_of_variation, limb_lengths
from stages.rig.triangulate import MAX_ERROR_PX, MIN_CONFIDENCE, MIN_VIEWS, triangulate

FPS = 30.0
WARM = ConsistencyParams().warm


@pytest.fixture(scope="module")
def scene():
    """(cameras, truth [T, K, 3] m, observations [V, T, K, 3]): 60 instants of one body
    walking a circle, seen with 6 px noise."""
    rng = np.random.default_rng(5)
    cams = ring_cameras(rng)
    truth = walking_body(60, np.zeros(2))
    return cams, truth, observe(cams, truth, rng, noise_px=6.0)


def held(cams, observed, fit: BoneFitParams | None):
    tri = triangulate(cams, observed)  # the instants as people
    params = ConsistencyParams(fit=fit)
    chosen = hold_clip(cams, observed, tri, FPS, params, MIN_CONFIDENCE, MAX_ERROR_PX, MIN_VIEWS)
    return tri, chosen


def test_fitted_joints_are_nearer_the_truth_and_their_bones_steadier(scene):
    cams, truth, observed = scene
    plain, none = held(cams, observed, None)
    fitted, chosen = held(cams, observed, BoneFitParams())
    assert none.fitted == 0
    # every instant after the first WARM, every limb joint (all are seen by all four views)
    assert chosen.fitted == (len(truth) - WARM) * len(JOINTS)
    joints = list(JOINTS)
    off_plain = np.linalg.norm(plain.points[WARM:, joints] - truth[WARM:, joints], axis=-1)
    off_fit = np.linalg.norm(fitted.points[WARM:, joints] - truth[WARM:, joints], axis=-1)
    assert off_fit.mean() < 0.9 * off_plain.mean(), (off_fit.mean(), off_plain.mean())
    cv_plain = {
        n: coefficient_of_variation(v[WARM:]) for n, v in limb_lengths(plain.points).items()
    }
    cv_fit = {n: coefficient_of_variation(v[WARM:]) for n, v in limb_lengths(fitted.points).items()}
    assert all(cv_fit[n] < cv_plain[n] for n in cv_plain), (cv_fit, cv_plain)
    # the points not on a limb are not touched, nor the first WARM instants
    other = np.setdiff1d(np.flatnonzero(np.isfinite(truth[0]).all(-1)), joints)
    np.testing.assert_array_equal(fitted.points[:, other], plain.points[:, other])
    np.testing.assert_array_equal(fitted.points[:WARM], plain.points[:WARM])
    # the error it publishes is the fitted points' own: the mean over the views used
    t, k = WARM + 5, joints[3]
    seen = [cams[v].normalize(observed[v, t, k, :2][None])[0] for v in range(len(cams))]
    ours = []
    for v, cam in enumerate(cams):
        local = cam.extrinsics[:, :3] @ fitted.points[t, k] + cam.extrinsics[:, 3]
        ours.append(np.hypot(*((local[:2] / local[2] - seen[v]) * np.diag(cam.matrix)[:2])))
    assert fitted.error[t, k] == pytest.approx(np.mean(ours), rel=1e-5)


def test_lengths_the_views_cannot_hold_are_not_forced(scene):
    cams, truth, observed = scene
    tri = triangulate(cams, observed[:, :1])
    before = tri.points.copy()
    double = {name: 2 * float(np.linalg.norm(truth[0, a] - truth[0, b])) for name, a, b in BONES}
    assert fit_bones(cams, observed[:, 0], tri, 0, double, BoneFitParams(), MAX_ERROR_PX) == 0
    np.testing.assert_array_equal(tri.points, before)
    assert fit_bones(cams, observed[:, 0], tri, 0, {}, BoneFitParams(), MAX_ERROR_PX) == 0
    np.testing.assert_array_equal(tri.points, before)
    true = {name: float(np.linalg.norm(truth[0, a] - truth[0, b])) for name, a, b in BONES}
    assert fit_bones(cams, observed[:, 0], tri, 0, true, BoneFitParams(), MAX_ERROR_PX) == len(
        JOINTS
    )
    assert not np.array_equal(tri.points, before)
