"""stages.rig.consistency: a keypoint two views agree on wrongly is triangulated again from the
views that keep it within its top speed and its bone length; nothing changes when no subset
does, or when the person was unseen too long to move from. Synthetic 4-camera scenes with
known truth (tests/stages/rig/rig_scenes.py), one person walking 1 cm an instant at 60 fps.
"""

from __future__ import annotations

import numpy as np
import pytest
from rig_scenes import observe, people, ring_cameras

from npu.models.sapiens2.keypoints import INDEX, NAMES
from stages.rig.consistency import Candidates, Choice, ConsistencyParams, choose, hold_clip
from stages.rig.reconstruct import Reconstructor, View2D
from stages.rig.triangulate import MAX_ERROR_PX, MIN_CONFIDENCE, MIN_VIEWS, triangulate

FPS = 60.0
BAD = 12  # the instant some views see a wrong elbow
# the other views' elbow is pushed 3 px off so that the wrong pair wins on error: ~7 mm a view
# at 3 m and ~1200 px focal, so the elbow taken from them is within 3 cm of the truth
NEAR_M = 0.03
ELBOW, SHOULDER = INDEX["right_elbow"], INDEX["right_shoulder"]


@pytest.fixture(scope="module")
def walk():
    """(cameras, truth [T, K, 3] m, observations [V, T, K, 3]): 15 instants of one person
    moving 1 cm an instant along x, seen by 4 cameras with 0.5 px noise."""
    rng = np.random.default_rng(3)
    cams = ring_cameras(rng)
    body = people(rng, 1)[0]
    truth = np.stack([body + [0.01 * t, 0.0, 0.0] for t in range(15)])
    return cams, truth, observe(cams, truth, rng, noise_px=0.5)


def seen_wrong(cams, truth, observed, wrong: np.ndarray, views, others_off_px: float = 3.0):
    """The observations with the elbow at BAD seen at `wrong` (m) by `views`, and the other
    views' elbow pushed off by others_off_px, so the wrong subset has the least error."""
    out = observed.copy()
    for v in range(len(cams)):
        if v in views:
            out[v, BAD, ELBOW, :2] = cams[v].project(wrong[None])[0]
        else:
            out[v, BAD, ELBOW, :2] = cams[v].project(truth[BAD, ELBOW][None])[0] + others_off_px
    return out


def held(cams, observed) -> tuple:
    """Every instant in order through hold_clip(): (triangulation, its Choice counts)."""
    tri = triangulate(cams, observed)  # the instants as people
    params = ConsistencyParams()
    return tri, hold_clip(cams, observed, tri, FPS, params, MIN_CONFIDENCE, MAX_ERROR_PX, MIN_VIEWS)


def test_an_elbow_two_views_agree_on_wrongly_is_taken_from_the_other_two(walk):
    cams, truth, observed = walk
    wrong = truth[BAD, ELBOW] + [0.0, 0.0, 0.35]  # 0.35 m up: past 12 m/s in 1/60 s
    bad = seen_wrong(cams, truth, observed, wrong, views=(0, 1))
    plain = triangulate(cams, bad)
    assert np.linalg.norm(plain.points[BAD, ELBOW] - wrong) < 0.01  # the wrong pair won
    tri, choice = held(cams, bad)
    assert np.linalg.norm(tri.points[BAD, ELBOW] - truth[BAD, ELBOW]) < NEAR_M
    assert tri.used[BAD, ELBOW].tolist() == [False, False, True, True]
    assert tri.error[BAD, ELBOW] <= MAX_ERROR_PX
    assert choice == Choice(moved=1, resized=0)
    # every other point as triangulated
    others = np.ones(tri.points.shape[:2], bool)
    others[BAD, ELBOW] = False
    np.testing.assert_array_equal(tri.points[others], plain.points[others])


def test_a_bone_off_its_length_within_reach_is_taken_from_the_views_that_keep_it(walk):
    cams, truth, observed = walk
    arm = truth[BAD, ELBOW] - truth[BAD, SHOULDER]
    wrong = truth[BAD, ELBOW] + 0.35 * arm  # the upper arm 35% long
    jump = np.linalg.norm(wrong - truth[BAD - 1, ELBOW])
    assert jump < ConsistencyParams().max_speed_mps / FPS  # the speed rule lets it through
    bad = seen_wrong(cams, truth, observed, wrong, views=(1, 2))
    assert np.linalg.norm(triangulate(cams, bad).points[BAD, ELBOW] - wrong) < 0.01
    tri, choice = held(cams, bad)
    assert np.linalg.norm(tri.points[BAD, ELBOW] - truth[BAD, ELBOW]) < NEAR_M
    assert tri.used[BAD, ELBOW].tolist() == [True, False, False, True]
    assert choice == Choice(moved=0, resized=1)


def test_a_point_no_view_subset_holds_stays_as_triangulated(walk):
    cams, truth, observed = walk
    wrong = truth[BAD, ELBOW] + [0.0, 0.0, 0.35]
    bad = seen_wrong(cams, truth, observed, wrong, views=(0, 1, 2))  # the truth in one view
    plain = triangulate(cams, bad)
    tri, choice = held(cams, bad)
    np.testing.assert_array_equal(tri.points, plain.points)
    np.testing.assert_array_equal(tri.used, plain.used)
    assert choice == Choice()


def test_after_a_gap_past_max_gap_s_a_joint_may_be_anywhere(walk):
    cams, truth, observed = walk
    moved = truth.copy()
    moved[BAD:] += [0.0, 0.5, 0.0]  # the person 0.5 m away after the gap
    seen = observe(cams, moved, np.random.default_rng(4), noise_px=0.5)
    tri = triangulate(cams, seen)
    before = tri.points.copy()
    prior, total = None, Choice()
    for t in range(seen.shape[1]):
        t_s = t / FPS + (1.0 if t >= BAD else 0.0)  # unseen for a second before BAD
        candidates = Candidates(cams, seen[:, t], MIN_CONFIDENCE, MAX_ERROR_PX, MIN_VIEWS)
        prior, choice = choose(prior, t_s, tri, t, candidates, ConsistencyParams())
        total += choice
    np.testing.assert_array_equal(tri.points, before)
    assert total == Choice()


def test_the_reconstructor_holds_a_rig_persons_keypoints_only_when_asked(walk):
    cams, truth, observed = walk
    wrong = truth[BAD, ELBOW] + [0.0, 0.0, 0.35]
    bad = seen_wrong(cams, truth, observed, wrong, views=(0, 1))
    plain, held_ = Reconstructor(cams), Reconstructor(cams, consistency=ConsistencyParams())
    for t in range(BAD + 1):
        views = {c.name: View2D((7,), bad[v, t][None]) for v, c in enumerate(cams)}
        a = plain(t / FPS, views, len(NAMES))
        b = held_(t / FPS, views, len(NAMES))
        assert a.ids == b.ids and len(a.ids) == 1  # one rig person throughout
    assert np.linalg.norm(a.points[0, ELBOW] - wrong) < 0.01
    assert np.linalg.norm(b.points[0, ELBOW] - truth[BAD, ELBOW]) < NEAR_M
    assert b.used[0, ELBOW].tolist() == [False, False, True, True]
    assert held_.chosen == Choice(moved=1, resized=0) and plain.chosen == Choice()
