"""A Sapiens2 refresh takes its track's newest frame when its pass is dispatched
(stages/models/sapiens2/runtime.py, Sapiens2Runtime.freshen), so a keyframe is as young as the
device allows: not an older frame, and never for a rig group's job."""

from __future__ import annotations

import numpy as np

from stages.models.sapiens2.job import PoseJob
from stages.models.sapiens2.runtime import Sapiens2Runtime
from stages.tracker import PersonTracker
from stages.tracks import NewestFrame, TrackRegistry
from tests.stages.models.inferred_items import context

NS = 1_000_000_000


def job(seq: int, ts: int, group: tuple | None = None) -> PoseJob:
    return PoseJob(
        camera="cam",
        seq=seq,
        capture_ts_ns=ts,
        deadline_ns=ts + 10 * NS,
        track_id=3,
        box_xywh=np.array([1, 2, 3, 4], np.float32),
        score=0.9,
        image=np.zeros((8, 8, 3), np.uint8),
        pose_age_s=2.0,
        group=group,
    )


def runtime(tmp_path):
    ctx = context(tmp_path)
    rt = Sapiens2Runtime(None, name="sapiens2", backend="cpu", model_id="m", synthetic=False)
    rt.attach(ctx)
    tracks = TrackRegistry.of(ctx).add("cam", PersonTracker("cam"))
    return rt, tracks


def newest(seq: int, ts: int) -> NewestFrame:
    return NewestFrame(seq, ts, ts + 10 * NS, np.ones((8, 8, 3), np.uint8), np.array(
        [5, 6, 7, 8], np.float32))  # fmt: skip


def test_a_refresh_moves_to_the_tracks_newest_frame(tmp_path):
    rt, tracks = runtime(tmp_path)
    with tracks.lock:
        tracks.tracked_on({3: newest(9, 5 * NS)})
    j = job(1, 1 * NS)
    rt.freshen(j)
    assert (j.seq, j.capture_ts_ns, j.deadline_ns) == (9, 5 * NS, 15 * NS)
    assert j.image.max() == 1 and j.box_xywh.tolist() == [5, 6, 7, 8]
    assert j.pose_age_s == 6.0  # still measured from the track's previous pose


def test_an_older_newest_frame_a_rig_groups_job_and_an_unknown_track_keep_their_frame(tmp_path):
    rt, tracks = runtime(tmp_path)
    with tracks.lock:
        tracks.tracked_on({3: newest(9, 5 * NS)})
    later = job(12, 6 * NS)
    rt.freshen(later)
    assert later.seq == 12
    grouped = job(1, 1 * NS, group=("rig", 4))
    rt.freshen(grouped)
    assert grouped.seq == 1 and grouped.image.max() == 0
    other = job(1, 1 * NS)
    other.track_id = 4
    rt.freshen(other)
    assert other.seq == 1


def test_tracks_not_seen_for_ten_seconds_are_forgotten(tmp_path):
    _, tracks = runtime(tmp_path)
    with tracks.lock:
        tracks.tracked_on({3: newest(1, 1 * NS), 4: newest(1, 1 * NS)})
        tracks.tracked_on({4: newest(2, 11 * NS + 1)})
    assert set(tracks.newest) == {4}
