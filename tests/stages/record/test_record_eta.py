"""`npucam process`'s ETA (stages/record/eta.py, and process.Progress on a virtual clock): the
planner's cost of the frames left at the poses per frame seen, scaled toward the measured pace
as frames are measured; the start-up before the first frame is not in the pace."""

from __future__ import annotations

import io

import pytest

from pipeline.clock import VirtualClock
from stages.record import eta
from stages.record.process import Progress

POSE_S = 2.4  # Sapiens2 0.4b's NPU2 pose (docs/device.md)


def _weight(frames: int) -> float:
    return frames / (frames + eta.PRIOR_FRAMES)


def test_nothing_done_gives_no_eta():
    assert eta.estimate(eta.PassCost(POSE_S), 100, 0, 0, 5.0) is None


def test_the_planned_time_left_is_the_frames_left_at_the_poses_per_frame_seen():
    # 10 frames with 25 poses done in exactly their planned time: 90 frames x 2.5 x 2.4 s left
    e = eta.estimate(eta.PassCost(POSE_S), 90, 10, 25, 25 * POSE_S)
    assert e.planned_s == pytest.approx(90 * 2.5 * POSE_S)
    assert e.pace == pytest.approx(1.0)
    assert e.remaining_s == pytest.approx(e.planned_s)


def test_the_measured_pace_takes_over_as_frames_are_measured():
    # the pass runs 20% slower than planned: after 1 frame the ETA moves a third of the way
    # to that pace (the planner weighs as 2 frames), after 18 frames 90% of the way
    cost = eta.PassCost(POSE_S, frame_s=0.1)
    one = eta.estimate(cost, 90, 1, 2, 1.2 * (0.1 + 2 * POSE_S))
    assert one.pace == pytest.approx(1.2)
    assert one.remaining_s == pytest.approx(one.planned_s * (1 + 0.2 / 3))
    many = eta.estimate(cost, 10, 18, 36, 1.2 * (18 * 0.1 + 36 * POSE_S))
    assert many.remaining_s == pytest.approx(many.planned_s * (1 + 0.2 * 0.9))


def test_progress_counts_the_pace_from_the_first_frame_done_not_the_start_up():
    clock = VirtualClock()
    progress = Progress(eta.PassCost(POSE_S), 20, 0, io.StringIO(), clock)
    clock.advance(30.0)  # model loading: nothing done
    assert progress.update(0, 0) is None
    clock.advance(2 * POSE_S)
    progress.update(1, 2)  # the first frame: the pace is counted from here
    clock.advance(2 * 2 * POSE_S * 1.5)  # two more frames of 2 poses, 1.5x slower than planned
    e = progress.update(3, 6)
    assert e.pace == pytest.approx(1.5)
    assert e.planned_s == pytest.approx(17 * 2 * POSE_S)
    assert e.remaining_s == pytest.approx(e.planned_s * (1 + _weight(2) * 0.5))
    assert [round(h[0], 6) for h in progress.history] == [30.0, 30 + 2 * POSE_S, 30 + 8 * POSE_S]
    assert [h[1] for h in progress.history] == [0, 1, 3]
    progress.close()


def test_a_resumed_pass_counts_from_where_it_resumed():
    clock = VirtualClock()
    progress = Progress(eta.PassCost(POSE_S), 100, 80, io.StringIO(), clock)
    assert progress.update(80, 0) is None  # the frames the take held are not this run's pace
    progress.update(81, 1)
    clock.advance(4 * POSE_S * 2.0)  # twice the planned time
    e = progress.update(85, 5)
    assert e.remaining_s == pytest.approx(15 * POSE_S * (1 + _weight(4) * 1.0))
    progress.close()
