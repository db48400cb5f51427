"""Left/right swaps of one view (stages/rig/sides.py) on the synthetic rig of rig_scenes.py
(4 cameras ~3 m away, 1 px noise), with left-right symmetric bodies so a swapped view looks
as a real one does: every left label on the right limb's image and back."""

from __future__ import annotations

import numpy as np
import pytest
from rig_scenes import observe, people, ring_cameras

from npu.models.sapiens2.keypoints import INDEX, NAMES
from stages.rig.associate import associate
from stages.rig.reconstruct import Reconstructor, View2D
from stages.rig.sides import MIRROR, mirror_index, unswap_views


def symmetric(bodies: np.ndarray) -> np.ndarray:
    """Each body with every right keypoint at its left counterpart mirrored across the body's
    midline plane (through its mean, normal along its shoulders)."""
    out = bodies.copy()
    for b, body in enumerate(bodies):
        axis = body[INDEX["left_shoulder"]] - body[INDEX["right_shoulder"]]
        axis[2] = 0.0
        axis /= np.linalg.norm(axis)
        centre = body.mean(0)
        for name in NAMES:
            if name.startswith("right_"):
                left = body[INDEX["left_" + name[6:]]]
                out[b, INDEX[name]] = left - 2 * np.dot(left - centre, axis) * axis
    return out


@pytest.fixture
def scene():
    rng = np.random.default_rng(7)
    cams = ring_cameras(rng)
    truth = symmetric(people(rng, 3))
    return cams, truth, observe(cams, truth, rng)


def test_mirror_index_pairs_each_side_and_keeps_the_midline():
    assert (MIRROR[MIRROR] == np.arange(len(NAMES))).all()
    assert MIRROR[INDEX["left_knee"]] == INDEX["right_knee"]
    assert MIRROR[INDEX["right_thumb4"]] == INDEX["left_thumb4"]
    assert MIRROR[INDEX["nose"]] == INDEX["nose"]
    assert MIRROR[INDEX["neck"]] == INDEX["neck"]
    i = INDEX["l_outer_end_of_upper_eyelid_line"]
    assert NAMES[MIRROR[i]] == "r_outer_end_of_upper_eyelid_line"
    assert list(mirror_index(["a_left", "left_b", "right_b", "leftover"])) == [0, 2, 1, 3]


def test_a_swapped_view_is_found_and_undone(scene):
    cams, _, observed = scene
    swapped_in = observed.copy()
    for v, p in ((2, 1), (0, 2)):
        swapped_in[v, p] = observed[v, p][MIRROR]
    fixed, swapped = unswap_views(cams, swapped_in)
    assert sorted(zip(*np.nonzero(swapped), strict=True)) == [(0, 2), (2, 1)]
    np.testing.assert_array_equal(fixed, observed)


def test_views_as_labelled_are_left_alone(scene):
    cams, _, observed = scene
    fixed, swapped = unswap_views(cams, observed)
    assert not swapped.any()
    np.testing.assert_array_equal(fixed, observed)


def test_two_views_cannot_tell_which_is_swapped(scene):
    cams, _, observed = scene
    swapped_in = observed[:2].copy()
    swapped_in[1, 0] = observed[1, 0][MIRROR]
    fixed, swapped = unswap_views(cams[:2], swapped_in)
    assert not swapped.any()
    np.testing.assert_array_equal(fixed, swapped_in)


def test_reconstructor_with_swap_sides_keeps_the_swapped_view_and_puts_it_back(scene):
    cams, truth, observed = scene
    swapped_in = observed.copy()
    swapped_in[3, 0] = observed[3, 0][MIRROR]
    views = {
        c.name: View2D((10 * v, 10 * v + 1, 10 * v + 2), swapped_in[v]) for v, c in enumerate(cams)
    }
    plain = Reconstructor(cams)(0.0, views, len(NAMES))
    fixing = Reconstructor(cams, swap_sides=True)
    fixed = fixing(0.0, views, len(NAMES))
    assert fixing.swapped_views == 1

    def person(result):
        return next(p for p, tracks in enumerate(result.tracks) if tracks["cam0"] == 0)

    # as labelled, the swapped view fails the epipolar gate: the person is made of 3 views
    assert "cam3" not in plain.tracks[person(plain)]
    assert fixed.tracks[person(fixed)] == {"cam0": 0, "cam1": 10, "cam2": 20, "cam3": 30}
    p = person(fixed)
    assert fixed.used[p, :, 3].mean() > 0.95  # the mirrored view is used again
    error = np.linalg.norm(fixed.points[p] - truth[0], axis=-1) * 1000
    assert np.nanmax(error) < 15.0 and np.isfinite(error).all()


def test_association_with_mirrored_scores_keeps_the_people_apart(scene):
    cams, _, observed = scene
    people = list(observed)
    assert associate(cams, people, mirror=MIRROR) == associate(cams, people)
    assert len(associate(cams, people, mirror=MIRROR)) == 3
