"""The take of `npucam process` (stages/record/take.py): a frame is written once its camera's
next det, its persons' poses and (a rig camera) its group's pose3d came, in recorded order, with
the recorded capture times and without the run's own times; the checkpoint is what a resumed
pass cuts the files back to and skips."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline import wire
from pipeline.assets import ANNY_MODEL, asset_path
from stages.body.model import AnnyModel
from stages.body.stage import BodyOptions
from stages.record.take import CHECKPOINT, Checkpoint, TakeError, TakeWriter
from tests.stages.body.body_scenes import PHENOTYPE, observe, walk_and_wave
from tests.stages.body.stage_items import pose3d, run_context, run_groups

T0 = 1_600_000_000 * 10**9
RECORDED = {"a": {s: T0 + s * 40_000_000 for s in range(4)}, "b": {s: T0 + s for s in range(4)}}
ORDER = {c: sorted(seqs) for c, seqs in RECORDED.items()}
COMMON = {"backend": "cpu", "model": "m", "synthetic": False}


def common(kind: str, camera: str, seq: int) -> dict:
    return {**COMMON, "kind": kind, "camera": camera, "seq": seq, "capture_ts": 5 * T0 + seq,
            "publish_ts": 7 * T0}  # fmt: skip


def det(camera: str, seq: int, tracks: list[int | None]) -> list:
    header = {**common("det", camera, seq), "labels": ["person"] * len(tracks), "track_ids": tracks}
    return wire.encode(f"det/{camera}", header, [("boxes", np.zeros((len(tracks), 4)))])


def pose(camera: str, seq: int, track: int, live: bool = False) -> list:
    header = {**common("pose", camera, seq), "track_id": track, "age_ms": 123.4, "live": live}
    return wire.encode(f"pose/{camera}", header, [("keypoints", np.full((2, 3), track))])


def pose3d_message(seq: int, views: dict[str, int]) -> list:
    header = {**common("pose3d", "rig", seq), "views": views, "person_ids": [1]}
    return wire.encode("pose3d/rig", header, [("points", np.zeros((1, 2, 4)))])


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def writer(out, rigs=None) -> TakeWriter:
    order = ORDER if rigs is None else {"a": ORDER["a"], "b": ORDER["b"]}
    return TakeWriter(out, order, RECORDED, rigs or {}, set(), poses=True)


def test_a_frame_is_written_once_the_next_det_and_every_tracked_persons_pose_came(tmp_path):
    w = writer(tmp_path)
    w.message(det("a", 0, [1, 2, None]))
    w.message(pose("a", 0, 2))
    w.message(det("a", 1, [1]))
    assert not (tmp_path / "2d" / "a.jsonl").exists()  # track 1's pose of frame 0 is missing
    w.message(pose("a", 0, 1, live=True))  # a live pose is not Sapiens2's
    assert not (tmp_path / "2d" / "a.jsonl").exists()
    w.message(pose("a", 0, 1))
    (line,) = lines(tmp_path / "2d" / "a.jsonl")
    assert line["seq"] == 0 and line["capture_ts_ns"] == RECORDED["a"][0]
    assert [p["header"]["track_id"] for p in line["poses"]] == [1, 2]
    assert [p["header"]["track_id"] for p in line["live"]] == [1]
    # the run's own times are gone, the recorded one is in
    for entry in [line["det"], *line["poses"]]:
        assert not {"capture_ts", "publish_ts", "age_ms", "publish_ts_str"} & set(entry["header"])
        assert entry["header"]["capture_ts_ns"] == RECORDED["a"][0]
    assert Checkpoint.read(tmp_path).cameras == {"a": 0}
    assert Checkpoint.read(tmp_path).poses == 2


def test_the_end_writes_the_last_frames_and_an_interrupted_end_does_not(tmp_path):
    w = writer(tmp_path / "cut")
    w.message(det("a", 0, []))
    w.message(det("a", 1, []))
    w.finish()  # dets of a's frames 2, 3 and of b never came: interrupted
    assert [x["seq"] for x in lines(tmp_path / "cut" / "2d" / "a.jsonl")] == [0]
    w = writer(tmp_path / "whole")
    for camera in ("a", "b"):
        for seq in range(4):
            w.message(det(camera, seq, []))
    w.finish()
    assert w.complete
    assert [x["seq"] for x in lines(tmp_path / "whole" / "2d" / "b.jsonl")] == [0, 1, 2, 3]


def test_a_rig_cameras_frame_waits_for_its_groups_pose3d_or_a_later_one(tmp_path):
    w = writer(tmp_path, rigs={"rig": ["a", "b"]})
    for seq in range(3):
        w.message(det("a", seq, []))
    assert not (tmp_path / "2d" / "a.jsonl").exists()
    w.message(pose3d_message(0, {"a": 1, "b": 0}))  # group 0 holds a's frame 1: frames 0 and 1 done
    assert [x["seq"] for x in lines(tmp_path / "2d" / "a.jsonl")] == [0, 1]
    (group,) = lines(tmp_path / "3d" / "rig.jsonl")
    assert group["header"]["capture_ts_ns"] == (RECORDED["a"][1] + RECORDED["b"][0]) // 2
    assert Checkpoint.read(tmp_path).groups == {"rig": 0}


def test_a_resumed_take_is_cut_to_its_checkpoint_and_skips_what_it_holds(tmp_path):
    w = writer(tmp_path)
    for seq in range(3):
        w.message(det("a", seq, []))
    with open(tmp_path / "2d" / "a.jsonl", "a") as f:
        f.write('{"half a line')  # a write the kill cut short
    resumed = writer(tmp_path)
    assert resumed.resume_after() == {"a": 1} and resumed.frames_written == 2
    resumed.message(det("a", 1, []))  # detected again, not written again
    for seq in (2, 3):
        resumed.message(det("a", seq, []))
    for seq in range(4):
        resumed.message(det("b", seq, []))
    resumed.finish()
    assert [x["seq"] for x in lines(tmp_path / "2d" / "a.jsonl")] == [0, 1, 2, 3]


def test_a_take_shorter_than_its_checkpoint_is_an_error_naming_the_file(tmp_path):
    w = writer(tmp_path)
    for seq in range(3):
        w.message(det("a", seq, []))
    (tmp_path / "2d" / "a.jsonl").write_text("")
    with pytest.raises(TakeError, match=r"a\.jsonl: shorter than its checkpoint"):
        writer(tmp_path)
    (tmp_path / CHECKPOINT).write_text("{")
    with pytest.raises(TakeError, match=r"checkpoint\.json: not a take checkpoint"):
        writer(tmp_path)


def body(seq: int, people: list[int]) -> list:
    """A body/rig message of its parts' shapes (stages/body/result.py), identity rotations
    of 2 bones; the names of its keypoints, none without people (as the stage's)."""
    names = ["nose", "neck"] if people else []
    header = {**common("body", "rig", seq), "person_ids": people, "keypoints": names}
    p = len(people)
    return wire.encode(
        "body/rig",
        header,
        [
            ("keypoints", np.ones((p, len(names), 3))),
            ("rotations", np.broadcast_to(np.eye(3), (p, 2, 3, 3))),
            ("translation", np.zeros((p, 3))),
            ("phenotype", np.full((p, 6), 0.5)),
        ],
    )


def test_a_bodys_trc_takes_its_keypoint_names_from_the_groups_with_people(tmp_path):
    """A pass whose last group had no one (its body message names no keypoint) still writes
    the fitted person's .trc with the names of the groups that had them."""
    w = TakeWriter(tmp_path, ORDER, RECORDED, {"rig": ["a", "b"]}, {"rig"}, poses=False)
    for seq in range(4):
        w.message(det("a", seq, []))
        w.message(det("b", seq, []))
    for seq, people in ((0, [1]), (1, [1]), (2, [1]), (3, [])):
        header = {**common("pose3d", "rig", seq), "views": {"a": seq, "b": seq}}
        header["person_ids"] = people
        points = np.ones((len(people), 308, 4))  # the rig's .trc names Sapiens2's 308 points
        w.message(wire.encode("pose3d/rig", header, [("points", points)]))
        w.message(body(seq, people))
    w.finish()
    trc = (tmp_path / "body" / "rig_person1.trc").read_text()
    assert "nose" in trc and "neck" in trc


def test_a_takes_body_files_are_the_ones_the_body_stage_writes_of_the_same_fits(tmp_path):
    """The take writes the .trc, and .mot and BVH (`exports`), from its body lines, the wire
    messages publish sent; over a resumed pass they hold every frame, where the body stage's
    own files hold what that run fitted. Of one run, the two are the same bytes."""
    model = AnnyModel.load(asset_path(ANNY_MODEL))
    seen = observe(model, PHENOTYPE, walk_and_wave(model, 3), 1.0, seed=2)
    points = np.concatenate([seen.points308, seen.confidence308[..., None]], axis=-1)
    recorded = {c: {s: T0 + s * 40_000_000 for s in range(3)} for c in ("a", "b")}
    groups = [
        replace(
            pose3d("rig", s, points[s : s + 1], person=1),
            cameras=("a", "b"),
            views={"a": s, "b": s},
            capture_ts_ns=recorded["a"][s],
            error=np.zeros((1, 308), np.float32),
            used=np.ones((1, 308, 2), np.uint8),
        )
        for s in range(3)
    ]
    (tmp_path / "stage").mkdir()

    options = BodyOptions(rig="rig", window=2, trc="stage/rig", mot="stage/rig", bvh="stage/rig")
    bodies, _ = run_groups(options, run_context(tmp_path), groups)
    order = {c: sorted(seqs) for c, seqs in recorded.items()}
    take = tmp_path / "take"
    w = TakeWriter(take, order, recorded, {"rig": ["a", "b"]}, {"rig"}, False, ("mot", "bvh"))
    for s, body in enumerate(bodies):
        w.message(det("a", s, []))
        w.message(det("b", s, []))
        w.message(wire.encode_result(groups[s], 7 * T0))
        w.message(wire.encode_result(body, 7 * T0))
    w.finish()
    assert w.finished
    for name in ("rig_person1.trc", "rig_person1.mot", "rig_person1.bvh"):
        assert (take / "body" / name).read_bytes() == (tmp_path / "stage" / name).read_bytes()
    assert "nRows=3" in (take / "body" / "rig_person1.mot").read_text()
