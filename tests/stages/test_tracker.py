"""The person tracker: assignment against scipy, ByteTrack's two stages, id stability and
expiry, and the pose-refresh order driving the scheduler for 4 cameras x 3 people."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import linear_sum_assignment

from stages.batches import ModelProfile, QueuedJob
from stages.planning.simulate import SimClock, simulate
from stages.scheduler import BatchScheduler
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


def test_a_clock_jump_back_is_counted_and_tracking_goes_on_with_the_same_ids(caplog):
    tracker = PersonTracker("lobby")
    day = 86_400 * S
    t = 1_700_000_000 * S
    ids = []
    for k in range(3):
        ids.append(
            [tb.track_id for tb in tracker.update(np.array([person(100 + 5 * k)]), [0.9], t)]
        )
        t += FRAME_NS
    tracker.pose_started(1)
    tracker.pose_finished(1, t - FRAME_NS, t)  # posed on the last frame before the jump
    with caplog.at_level("WARNING"):
        for k in range(3, 20):  # the clock stepped back a day, then runs on
            at = t - day + (k - 3) * FRAME_NS
            ids.append(
                [tb.track_id for tb in tracker.update(np.array([person(100 + 5 * k)]), [0.9], at)]
            )
    assert ids == [[1]] * 20
    assert tracker.clock_jumps == 1 and tracker.last_jump_ns == -day + FRAME_NS
    assert [r for r in caplog.records if "clock jump" in r.message and "'lobby'" in r.message]
    # the pose time moved with the clock: the track's pose is old, not a day in the future
    track = tracker.track(1)
    assert track.pose_ts_ns is not None and track.pose_ts_ns <= at
    assert tracker.pose_queue() == [track]


def test_a_pose_from_before_a_jump_never_looks_newer_than_the_newest_frame():
    tracker = PersonTracker("lobby")
    tracker.update(np.array([person(100)]), [0.9], 5 * S)
    tracker.update(np.array([person(100)]), [0.9], 1 * S)  # back 4 s
    tracker.pose_started(1)
    tracker.pose_finished(1, 5 * S, 2 * S)  # the job was made on the frame before the jump
    assert tracker.track(1).pose_ts_ns == 1 * S


def test_a_camera_keeps_at_most_max_tracks_and_the_oldest_lost_make_room():
    tracker = PersonTracker("lobby", max_tracks=3)
    tracker.update(np.array([person(0), person(200), person(400)]), np.full(3, 0.9), 0)
    out = tracker.update(np.array([person(600)]), [0.9], FRAME_NS)  # 1-3 lost, 4 replaces 1
    assert [tb.track_id for tb in out] == [4]
    assert {t.track_id for t in tracker.tracks + tracker.lost_tracks} == {2, 3, 4}
    boxes = np.array([person(600), person(800), person(1000), person(1200)])
    out = tracker.update(boxes, np.full(4, 0.9), 2 * FRAME_NS)
    assert [tb.track_id for tb in out] == [4, 5, 6]  # 2 and 3 made room; no room for a 4th
    assert tracker.tracks_refused == 1 and len(tracker.tracks) == 3


def _extended_optimum(iou: np.ndarray, min_iou: float) -> float:
    """ByteTrack's lapjv(extend_cost=True, cost_limit=1 - min_iou) objective, solved on the
    whole matrix at once by scipy: the reference for the per-component solver."""
    n, m = iou.shape
    limit = 1.0 - min_iou
    big = np.full((n + m, m + n), 1e6)
    big[:n, :m] = np.where(iou >= min_iou, 1.0 - iou, 1e6)
    big[np.arange(n), m + np.arange(n)] = limit / 2
    big[n + np.arange(m), np.arange(m)] = limit / 2
    big[n:, m:] = 0
    r, c = linear_sum_assignment(big)
    return float(big[r, c].sum())


@settings(max_examples=150, deadline=None)
@given(
    boxes=st.tuples(st.integers(0, 9), st.integers(0, 9)).flatmap(
        lambda nm: st.tuples(
            arrays(np.float64, (nm[0], 3), elements=st.floats(0, 60, allow_nan=False)),
            arrays(np.float64, (nm[1], 3), elements=st.floats(0, 60, allow_nan=False)),
        )
    ),
    min_iou=st.sampled_from([0.2, 0.5]),
)
def test_match_by_iou_finds_bytetracks_optimum_over_the_whole_matrix(boxes, min_iou):
    a, b = (np.column_stack([p[:, 0], p[:, 1], p[:, 0] + 5 + p[:, 2], p[:, 1] + 5 + p[:, 2]])
            for p in boxes)  # fmt: skip
    iou = iou_matrix(a, b)
    pairs = match_by_iou(iou, min_iou)
    assert len({r for r, _ in pairs}) == len(pairs) == len({c for _, c in pairs})
    assert all(iou[r, c] >= min_iou for r, c in pairs)
    limit = 1.0 - min_iou
    unmatched = iou.shape[0] + iou.shape[1] - 2 * len(pairs)
    total = sum(1.0 - iou[r, c] for r, c in pairs) + unmatched * limit / 2
    assert total == pytest.approx(_extended_optimum(iou, min_iou), abs=1e-9)


def test_match_by_iou_solves_far_apart_boxes_one_pair_at_a_time(monkeypatch):
    import stages.tracker as tracker_module

    sizes = []
    real = tracker_module.linear_sum_assignment
    monkeypatch.setattr(
        tracker_module, "linear_sum_assignment", lambda c: (sizes.append(c.shape), real(c))[1]
    )
    xs = np.arange(1000) * 100.0
    tracks = np.column_stack([xs, np.zeros(1000), xs + 50, np.full(1000, 100.0)])
    pairs = match_by_iou(iou_matrix(tracks, tracks + 2.0), 0.2)
    assert pairs == [(i, i) for i in range(1000)]
    assert sizes == []  # every pair is a component of its own: no assignment problem at all


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
