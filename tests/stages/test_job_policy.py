"""The job policy (stages/job_policy.py): which enabled model gets a job on which target of a
frame, from what each model declares (npu.models.RunsOn) and the detect stage's keys; on
capture times passed in, so every case here is exact."""

from __future__ import annotations

import numpy as np

from npu.models import RunsOn
from stages.detect import DetectOptions
from stages.job_policy import Target, Wanted, decide, due, regions, settings, wanted

NS = 1_000_000_000


def person(tid: int, refresh: int | None = None) -> Target:
    return Target("person", np.array([0, 0, 10, 20], np.float32), track_id=tid, refresh=refresh)


def face(tid: int | None, source: str = "yunet") -> Target:
    points = np.zeros((5, 2), np.float32) if source else None
    return Target("face", np.zeros(4, np.float32), track_id=tid, landmarks=points,
                  landmark_source=source)  # fmt: skip


def picked(jobs: list[tuple[str, Target]]) -> list[tuple[str, str, int | None]]:
    return [(m, t.kind, t.track_id) for m, t in jobs]


def test_refresh_takes_the_due_persons_in_refresh_order_up_to_the_per_frame_budget():
    pose = Wanted("pose", RunsOn("person", "refresh", max_per_frame=2))
    targets = [person(1, refresh=2), person(2), person(3, refresh=0), person(4, refresh=1)]
    assert picked(decide([pose], targets, 0, {})) == [("pose", "person", 3), ("pose", "person", 4)]
    # a rig's posed group: every due person, whatever the budget
    everyone = decide([pose], targets, 0, {}, refresh_all=True)
    assert [t.track_id for _, t in everyone] == [3, 4, 1]


def test_an_interval_model_runs_once_per_interval_of_capture_time_per_camera():
    clip = Wanted("clip", RunsOn("region", "interval", interval_s=1.0))
    marks: dict[str, int] = {}
    regions_ = [Target("region", track_id=1), Target("region", track_id=2)]
    assert len(decide([clip], regions_, 10 * NS, marks)) == 2
    assert decide([clip], regions_, 10 * NS + NS // 2, marks) == []  # 0.5 s later: not due
    assert decide([clip], [], 11 * NS, marks) == []  # due, but nothing to run on: not noted
    assert marks == {"clip": 10 * NS}
    assert len(decide([clip], regions_, 11 * NS + 1, marks)) == 2
    assert len(decide([clip], regions_, 5 * NS, marks)) == 2  # the clock went back: due


def test_due_notes_the_time_only_when_the_interval_has_passed():
    marks: dict[str, int] = {}
    assert due(marks, "m", 100, 0.0) and marks == {"m": 100}
    assert not due(marks, "m", 100 + NS - 1, 1.0) and marks == {"m": 100}
    assert due(marks, "m", 100 + NS, 1.0) and marks == {"m": 100 + NS}


def test_a_face_model_takes_faces_with_landmarks_and_a_face_without_still_uses_the_interval():
    ada = Wanted("adaface", RunsOn("face", "interval", interval_s=1.0))
    marks: dict[str, int] = {}
    assert decide([ada], [face(7, source="")], 0, marks) == []
    assert marks == {"adaface": 0}  # as the detect stage always did: a face seen starts it
    assert decide([ada], [face(7)], NS // 2, marks) == []
    assert picked(decide([ada], [face(7), face(None, "")], NS, marks)) == [("adaface", "face", 7)]


def test_every_frame_models_take_every_target_of_their_kind_in_order_model_by_model():
    toy = Wanted("toy", RunsOn("person", "frame"))
    whole = Wanted("whole", RunsOn("frame", "frame"))
    capped = Wanted("capped", RunsOn("person", "frame", max_per_frame=1))
    targets = [person(5), Target("frame"), person(6, refresh=0), face(5)]
    assert picked(decide([whole, toy, capped], targets, 0, {})) == [
        ("whole", "frame", None),
        ("toy", "person", 5),
        ("toy", "person", 6),
        ("capped", "person", 5),
    ]


def test_the_detect_keys_set_the_limits_of_their_targets_and_turn_models_off():
    refresh = RunsOn("person", "refresh", max_per_frame=1)
    faces = RunsOn("face", "interval")
    region = RunsOn("region", "interval", interval_s=1.0, max_per_frame=4)
    toy = RunsOn("person", "frame", max_per_frame=3)
    o = DetectOptions(pose_jobs_per_frame=2, face_interval_s=0.5, clip="persons",
                      clip_interval_s=2.0, clip_max_per_frame=3)  # fmt: skip
    assert settings(refresh, o) == RunsOn("person", "refresh", max_per_frame=2)
    assert settings(faces, o) == RunsOn("face", "interval", interval_s=0.5)
    assert settings(region, o) == RunsOn("region", "interval", interval_s=2.0, max_per_frame=3)
    assert settings(toy, o) == toy  # no detect key names it: as declared
    off = DetectOptions(pose=False, faces=False, clip="off")
    assert [settings(r, off) for r in (refresh, faces, region)] == [None, None, None]
    declared = [("sapiens2", refresh), ("adaface", faces), ("clip", region), ("x", None)]
    assert [w.model for w in wanted(declared, o)] == ["sapiens2", "adaface", "clip"]
    assert [w.model for w in wanted(declared, off)] == []


def test_regions_are_the_whole_frame_or_the_tracked_boxes_by_track_without_degenerate_ones():
    boxes = {
        9: np.array([5, 5, 30, 40], np.float32),
        2: np.array([0, 0, 1.5, 40], np.float32),  # 1.5 px wide: no crop
        4: np.array([1, 2, 3, 4], np.float32),
    }
    assert [t.track_id for t in regions(boxes, (64, 48), whole_frame=False)] == [4, 9]
    (frame,) = regions(boxes, (64, 48), whole_frame=True)
    assert frame.track_id is None and frame.box_xywh is not None
    np.testing.assert_array_equal(frame.box_xywh, [0, 0, 64, 48])
