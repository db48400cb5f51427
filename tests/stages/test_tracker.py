"""The person tracker: assignment against scipy, ByteTrack's two stages, id stability and
expiry, and the pose-refresh order driving the scheduler for 4 cameras x 3 people."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import linear_sum_assignment

from stages.scheduler import BatchScheduler, ModelProfile, QueuedJob, SimClock, simulate
from stages.tracker import (
    PersonTracker,
    TrackerError,
    iou_matrix,
    linear_assignment,
    match_by_iou,
)

S = 1_000_000_000
MS = 1_000_000
FRAME_NS = 100 * MS  # 10 fps


def person(x: float, y: float = 100.0, w: float = 80.0, h: float = 200.0) -> list[float]:
    return [x, y, x + w, y + h]


# -- matching primitives -------------------------------------------------------------------


def test_iou_matrix_matches_hand_values():
    a = np.array([[0, 0, 10, 10], [0, 0, 0, 0]], np.float32)
    b = np.array([[5, 0, 15, 10], [0, 0, 10, 10], [20, 20, 30, 30]], np.float32)
    expected = np.array([[50 / 150, 1.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(iou_matrix(a, b), expected, rtol=0, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(
    cost=st.tuples(st.integers(0, 7), st.integers(0, 7)).flatmap(
        lambda shape: arrays(
            np.float64, shape, elements=st.floats(0, 100, allow_nan=False, width=32)
        )
    )
)
def test_linear_assignment_finds_scipys_optimum(cost):
    rows, cols = linear_assignment(cost)
    ref_rows, ref_cols = linear_sum_assignment(cost)
    assert len(rows) == len(ref_rows) == min(cost.shape)
    assert len(set(rows)) == len(rows) and len(set(cols)) == len(cols)
    # ties may pick another optimal pairing; the total must be scipy's
    assert cost[rows, cols].sum() == pytest.approx(cost[ref_rows, ref_cols].sum(), abs=1e-9)


def test_match_by_iou_drops_pairs_below_the_gate():
    iou = np.array([[0.9, 0.1], [0.05, 0.15]])
    assert match_by_iou(iou, 0.2) == [(0, 0)]


# -- association --------------------------------------------------------------------------


def test_ids_persist_across_frames_with_moving_boxes():
    tracker = PersonTracker("cam0")
    ids = None
    for k in range(30):
        # three people walking at different speeds; detection order shuffles every frame
        boxes = [person(50 + 6 * k), person(300 - 4 * k, 120), person(500 + 2 * k, 90)]
        order = np.roll(np.arange(3), k)
        out = tracker.update(np.array(boxes)[order], np.full(3, 0.9), k * FRAME_NS)
        by_person = {int(order[tb.detection]): tb.track_id for tb in out}
        if ids is None:
            ids = by_person
        assert by_person == ids
    assert sorted(ids.values()) == [1, 2, 3]


def test_constant_velocity_prediction_keeps_fast_movers():
    # a person accelerating to 70 px per frame with an 80 px wide box: consecutive boxes
    # then overlap by IoU 0.06, below the 0.2 gate, so only the prediction keeps the id
    tracker = PersonTracker("cam0")
    seen, x = set(), 0.0
    for k in range(25):
        x += min(10.0 * k, 70.0)
        out = tracker.update(np.array([person(x)]), np.array([0.9]), k * FRAME_NS)
        seen |= {tb.track_id for tb in out}
    assert iou_matrix(np.array([person(0)]), np.array([person(70)]))[0, 0] < 0.2
    assert seen == {1}


def test_new_people_get_new_ids_and_ids_are_never_reused():
    tracker = PersonTracker("cam0", lost_buffer_s=0.3)
    t = 0
    tracker.update(np.array([person(0)]), np.array([0.9]), t)
    t += FRAME_NS
    out = tracker.update(np.array([person(2), person(400)]), np.array([0.9, 0.8]), t)
    assert [tb.track_id for tb in out] == [1, 2]
    for _ in range(5):  # person 1 leaves; expires after 0.3 s
        t += FRAME_NS
        tracker.update(np.array([person(400)]), np.array([0.9]), t)
    assert tracker.track(1) is None
    t += FRAME_NS
    out = tracker.update(np.array([person(2), person(400)]), np.array([0.9, 0.9]), t)
    assert [tb.track_id for tb in out] == [3, 2]


def test_lost_track_is_recovered_within_the_buffer_and_expires_after_it():
    tracker = PersonTracker("cam0", lost_buffer_s=0.5)
    tracker.update(np.array([person(100)]), np.array([0.9]), 0)
    for k in range(1, 5):  # occluded for 0.4 s
        assert tracker.update(np.zeros((0, 4)), np.zeros(0), k * FRAME_NS) == []
    assert [t.track_id for t in tracker.lost_tracks] == [1]
    out = tracker.update(np.array([person(100)]), np.array([0.9]), 5 * FRAME_NS)
    assert [tb.track_id for tb in out] == [1] and tracker.lost_tracks == []

    for k in range(6, 11):  # lost since 0.5 s: still kept at 1.0 s, gone at 1.1 s
        tracker.update(np.zeros((0, 4)), np.zeros(0), k * FRAME_NS)
    assert tracker.track(1) is not None
    tracker.update(np.zeros((0, 4)), np.zeros(0), 11 * FRAME_NS)
    assert tracker.track(1) is None
    out = tracker.update(np.array([person(100)]), np.array([0.9]), 12 * FRAME_NS)
    assert [tb.track_id for tb in out] == [2]


def test_low_score_boxes_extend_tracks_but_never_start_one():
    tracker = PersonTracker("cam0")
    tracker.update(np.array([person(100)]), np.array([0.9]), 0)
    # the person is partly occluded (score 0.3) and a low-score clutter box appears
    out = tracker.update(np.array([person(104), person(600)]), np.array([0.3, 0.3]), FRAME_NS)
    assert [(tb.track_id, tb.detection) for tb in out] == [(1, 0)]
    assert [t.track_id for t in tracker.tracks] == [1]
    # a low box that overlaps a live track less than low_match_iou (0.5) does not extend it
    out = tracker.update(np.array([person(150)]), np.array([0.3]), 2 * FRAME_NS)
    assert out == [] and [t.track_id for t in tracker.lost_tracks] == [1]


def test_low_score_box_does_not_revive_a_lost_track():
    tracker = PersonTracker("cam0")
    tracker.update(np.array([person(100)]), np.array([0.9]), 0)
    tracker.update(np.zeros((0, 4)), np.zeros(0), FRAME_NS)
    out = tracker.update(np.array([person(100)]), np.array([0.3]), 2 * FRAME_NS)
    assert out == [] and [t.track_id for t in tracker.lost_tracks] == [1]


def test_high_box_below_new_track_score_matches_but_does_not_start():
    tracker = PersonTracker("cam0", high_score=0.5, new_track_score=0.6)
    assert tracker.update(np.array([person(100)]), np.array([0.55]), 0) == []
    tracker.update(np.array([person(100)]), np.array([0.9]), FRAME_NS)
    out = tracker.update(np.array([person(102)]), np.array([0.55]), 2 * FRAME_NS)
    assert [tb.track_id for tb in out] == [1]


@pytest.mark.parametrize(
    ("boxes", "scores", "message"),
    [
        (np.zeros((2, 3)), np.zeros(2), r"boxes must be \[N, 4\]"),
        (np.zeros((2, 4)), np.zeros(3), r"scores must be \[2\]"),
        (np.array([[0, 0, np.nan, 1]]), np.ones(1), "NaN"),
        (np.array([[5, 0, 1, 1]]), np.ones(1), "box 0 has x2 < x1"),
    ],
)
def test_bad_detections_are_refused_naming_the_camera(boxes, scores, message):
    with pytest.raises(TrackerError, match=f"'lobby'.*{message}"):
        PersonTracker("lobby").update(boxes, scores, 0)


def test_time_going_backwards_is_refused():
    tracker = PersonTracker("lobby")
    tracker.update(np.zeros((0, 4)), np.zeros(0), 10)
    with pytest.raises(TrackerError, match="'lobby'.*before the previous frame"):
        tracker.update(np.zeros((0, 4)), np.zeros(0), 9)


@settings(max_examples=80, deadline=None)
@given(
    frames=st.lists(
        st.lists(
            st.tuples(st.floats(0, 600), st.floats(0, 400), st.floats(1, 200), st.floats(0, 1)),
            max_size=8,
        ),
        max_size=15,
    )
)
def test_any_detection_sequence_keeps_one_to_one_matches_and_fresh_ids(frames):
    tracker = PersonTracker("cam0")
    issued: set[int] = set()
    for k, dets in enumerate(frames):
        boxes = np.array([[x, y, x + w, y + 2 * w] for x, y, w, _ in dets]).reshape(-1, 4)
        scores = np.array([sc for *_, sc in dets])
        before = {t.track_id for t in tracker.tracks + tracker.lost_tracks}
        out = tracker.update(boxes, scores, k * FRAME_NS)
        ids = [tb.track_id for tb in out]
        assert len(ids) == len(set(ids))  # a track takes at most one box per frame
        assert len({tb.detection for tb in out}) == len(out)  # a box joins at most one track
        for tb in out:
            assert scores[tb.detection] >= tracker.low_score
            if tb.track_id not in before:  # a new track: a fresh id from a high box
                assert tb.track_id not in issued
                assert scores[tb.detection] >= tracker.new_track_score
        issued |= set(ids)
        assert {t.track_id for t in tracker.tracks} == set(ids)


# -- pose refresh order -------------------------------------------------------------------


def test_pose_queue_is_oldest_pose_first_and_skips_running_poses():
    tracker = PersonTracker("cam0")
    tracker.update(np.array([person(0), person(200), person(400)]), np.full(3, 0.9), 0)
    assert [t.track_id for t in tracker.pose_queue()] == [1, 2, 3]  # none posed yet
    tracker.pose_started(1)
    assert [t.track_id for t in tracker.pose_queue()] == [2, 3]
    tag = tracker.pose_finished(1, capture_ts_ns=0, at_ns=2 * S)
    assert (tag.track_id, tag.capture_ts_ns, tag.age_ns, tag.since_previous_ns) == (
        1,
        0,
        2 * S,
        None,
    )
    tracker.pose_started(2)
    tracker.pose_finished(2, capture_ts_ns=1 * S, at_ns=3 * S)
    assert [t.track_id for t in tracker.pose_queue()] == [3, 1, 2]
    tracker.pose_started(3)
    assert tracker.pose_finished(3, None, 4 * S) is None  # dropped: back in the queue
    assert [t.track_id for t in tracker.pose_queue(limit=2)] == [3, 1]
    tag = tracker.pose_finished(1, capture_ts_ns=5 * S, at_ns=7 * S)
    assert tag.since_previous_ns == 5 * S


def test_four_cameras_three_people_every_track_refreshed_within_bound():
    """12 people, one device, 2.4 s per pose: each track is refreshed at least every
    people x pose cost x 1.2 = 34.56 s, and every pose carries its track id and age.
    Cameras run at 5 fps; the device is simulated."""
    pose_s = 2.4
    people = 12
    bound_ns = round(people * pose_s * 1.2 * S)
    clock = SimClock()
    sapiens = ModelProfile("sapiens2", 1, 0.0, tuple(f"sapiens2/{i}" for i in range(7)), pose_s)
    sched = BatchScheduler([sapiens], clock=clock)
    cameras = [f"cam{c}" for c in range(4)]
    trackers = {cam: PersonTracker(cam) for cam in cameras}
    refreshes: dict[tuple[str, int], list[int]] = {}
    tags = []

    def frame(cam: str, k: int):
        def run():
            ts = clock.t
            phase = cameras.index(cam) * 37.0
            boxes = np.array([person(phase + 150 * p + 20 * np.sin(k / 10 + p)) for p in range(3)])
            trackers[cam].update(boxes, np.full(3, 0.9), ts)
            for track in trackers[cam].pose_queue():
                sched.submit(
                    QueuedJob(
                        model="sapiens2",
                        camera=cam,
                        payload=(track.track_id, ts),
                        deadline_ns=ts + 5 * S,
                        priority=track.pose_priority,
                        key=(cam, track.track_id),
                    )
                )

        return run

    def on_dispatch(batch):
        for job in batch.jobs:
            trackers[job.camera].pose_started(job.payload[0])

    def on_complete(batch, returned):
        done = {id(job) for job, _ in returned}
        for job in batch.jobs:
            track_id, capture_ts = job.payload
            ok = id(job) in done
            tag = trackers[job.camera].pose_finished(track_id, capture_ts if ok else None, clock.t)
            if ok:
                tags.append(tag)
                refreshes.setdefault((job.camera, track_id), []).append(clock.t)

    until = 150 * S
    events = [
        (k * 200 * MS + c * 7 * MS, frame(cam, k))
        for k in range(until // (200 * MS))
        for c, cam in enumerate(cameras)
    ]
    simulate(
        sched,
        clock,
        events,
        lambda b: pose_s + b.switch_s,
        until,
        on_dispatch=on_dispatch,
        on_complete=on_complete,
    )
    assert sorted(refreshes) == [(cam, t) for cam in cameras for t in (1, 2, 3)]
    for key, times in refreshes.items():
        gaps = np.diff([0, *times, until])
        assert gaps.max() <= bound_ns, (key, gaps / S)
    counts = [len(times) for times in refreshes.values()]
    assert min(counts) >= 4 and max(counts) - min(counts) <= 1, counts  # an equal share each
    for tag in tags:
        assert 0 < tag.age_ns <= 5 * S
    assert sched.stats.busy_fraction(clock.t) > 0.95
