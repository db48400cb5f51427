"""stages/rig/id_switches.py: an id that moves to another person is a jump, a person under a
new id where an absent id was is a rejoin, a position that jumps and comes back is a glitch,
people who walk keep their ids with no switch."""

from __future__ import annotations

import numpy as np

from npu.models.sapiens2.keypoints import NAMES
from stages.rig.id_switches import HIPS, IdSwitches, person_centre

DT = 1 / 30


def _people(*hips: tuple[float, float]) -> np.ndarray:
    """[P, 308, 3]: each person's hips around (x, y, 0.9), every other point NaN."""
    points = np.full((len(hips), len(NAMES), 3), np.nan)
    for p, (x, y) in enumerate(hips):
        points[p, HIPS[0]] = [x - 0.1, y, 0.9]
        points[p, HIPS[1]] = [x + 0.1, y, 0.9]
    return points


def test_two_people_walking_keep_their_ids_without_a_switch():
    ids = IdSwitches()
    for f in range(60):
        x = 1.2 * f * DT  # 1.2 m/s
        ids.update(f * DT, (0, 1), _people((x, 0.0), (-x, 1.0)))
    assert (ids.switches, ids.glitches, ids.new_ids) == (0, 0, 2)


def test_ids_that_swap_people_are_two_jumps():
    ids = IdSwitches()
    for f in range(5):
        ids.update(f * DT, (0, 1), _people((0.0, 0.0), (2.0, 0.0)))
    for f in range(5, 10):  # from here on each id is on the other person
        ids.update(f * DT, (0, 1), _people((2.0, 0.0), (0.0, 0.0)))
    assert (ids.jumps, ids.rejoins, ids.glitches) == (2, 0, 0)


def test_at_a_slow_rate_a_swap_is_still_a_jump():
    # one group a second (a rig paced slower than its recording): the speed bound allows
    # 3.3 m, the step bound 1 m
    ids = IdSwitches()
    for f in range(3):
        ids.update(float(f), (0, 1), _people((0.0, 0.0), (1.3, 0.0)))
    for f in range(3, 6):
        ids.update(float(f), (0, 1), _people((1.3, 0.0), (0.0, 0.0)))
    assert ids.jumps == 2


def test_a_position_that_jumps_for_one_instant_is_a_glitch_not_a_switch():
    ids = IdSwitches()
    for f, x in enumerate([0.0, 0.0, 1.5, 0.0, 0.0]):
        ids.update(f * DT, (0,), _people((x, 0.0)))
    assert (ids.switches, ids.glitches) == (0, 1)


def test_a_new_id_where_an_absent_one_was_is_a_rejoin_and_far_away_a_new_person():
    ids = IdSwitches()
    ids.update(0.0, (0,), _people((0.0, 0.0)))
    ids.update(DT, (1,), _people((0.1, 0.0)))  # id 0 gone, id 1 where it was
    ids.update(2 * DT, (1, 2), _people((0.1, 0.0), (3.0, 0.0)))  # id 2: someone else
    for f in range(3, 34):  # id 1 gone from 30 updates on: forgotten
        ids.update(f * DT, (2,), _people((3.0, 0.0)))
    ids.update(34 * DT, (3,), _people((0.1, 0.0)))  # a new person where id 1 was long ago
    assert (ids.rejoins, ids.jumps, ids.new_ids) == (1, 0, 4)


def test_the_centre_is_the_hips_or_the_median_of_what_was_triangulated():
    points = _people((1.0, 2.0))[0]
    np.testing.assert_allclose(person_centre(points), [1.0, 2.0, 0.9])
    points[HIPS[0]] = np.nan
    points[0] = [5.0, 5.0, 5.0]
    np.testing.assert_allclose(person_centre(points), [3.05, 3.5, 2.95])
    assert person_centre(np.full((17, 3), np.nan)) is None
