"""The detect stage's per-frame pose (stages/live_pose.py) on a real person (Pose2Sim's lab
clip, MediaPipe's real weights): a 308-keypoint pose for every tracked person on every frame
with the detector run only to find people, a real Sapiens2 keyframe fused through the run's
tracks (a synthetic one never), and the wire form an existing pose subscriber still reads."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from npu.models.sapiens2.keypoints import INDEX, NAMES
from pipeline import wire
from pipeline.assets import asset_path
from pipeline.config import ConfigError, parse_config
from pipeline.graph import Context, check_stages
from pipeline.messages import Detections, Frame
from pipeline.metrics import Metrics
from stages.detect import Detect, DetectOptions
from stages.landmarks.fusion import SOURCE_ABSENT, SOURCE_CPU, SOURCE_KEYFRAME
from stages.landmarks.result import LivePoseResult
from stages.models.sapiens2.job import PoseJob
from stages.rig.groups import RigGroups, RigRegistry
from stages.tracks import Keyframe

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
FACE = [i for i, n in enumerate(NAMES) if n.startswith("face_")]


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    """The first 24 frames of Pose2Sim's single-person cam01 (1088x1920 at 60 fps), halved."""
    cap = cv2.VideoCapture(str(asset_path("pose2sim_single_cam01.mp4")))
    out = []
    while len(out) < 24:
        ok, image = cap.read()
        assert ok, "pose2sim_single_cam01.mp4 ended early"
        out.append(cv2.resize(image, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA))
    cap.release()
    return out


def make_stage(tmp_path: Path, **live) -> Detect:
    config = parse_config(
        {"cameras": [{"name": "cam", "url": "synthetic:"}], "stages": [{"kind": "capture"}]},
        tmp_path / "run.toml",
    )
    options = DetectOptions(face="none", live={"enabled": True, **live})
    return Detect("detect", options, Context(config, Metrics()))


def at(i: int) -> int:
    return T0 + round(i * NS / 60)


def run(stage: Detect, frames: list[np.ndarray], start: int = 0) -> list[list]:
    return [
        stage.process(Frame("cam", start + i, at(start + i), at(start + i) + 10 * NS, image))
        for i, image in enumerate(frames)
    ]


def live_of(items: list) -> list[LivePoseResult]:
    return [i for i in items if isinstance(i, LivePoseResult)]


def test_each_tracked_person_has_a_308_point_pose_every_frame_and_detection_only_finds_people(
    tmp_path, frames
):
    stage = make_stage(tmp_path)
    outs = run(stage, frames)
    for items in outs:
        det = items[0]
        assert isinstance(det, Detections) and det.labels == ("person",)
        (pose,) = live_of(items)
        assert pose.track_id == det.extra["track_ids"][0]  # the same id as det/ and Sapiens2's
        assert pose.keypoints.shape == (308, 3) and pose.model == "mediapipe-landmarks"
        assert not pose.synthetic and pose.keyframe_seq is None
        src = pose.source
        body = [INDEX[n] for n in ("left_shoulder", "right_knee", "left_heel", "right_big_toe")]
        assert (src[body] == SOURCE_CPU).all()
        assert (src[FACE] == SOURCE_ABSENT).all()  # no keyframe: never invented
        assert (pose.keypoints[src == SOURCE_ABSENT, 2] == 0).all()
        assert np.isnan(pose.keyframe_age_ms).all()
        x1, y1, x2, y2 = pose.box
        xy = pose.keypoints[src == SOURCE_CPU, :2]
        assert ((xy >= [x1 - 1, y1 - 1]) & (xy <= [x2 + 1, y2 + 1])).mean() > 0.9
    assert len({live_of(o)[0].track_id for o in outs}) == 1
    gauges = stage.gauges()
    assert gauges["live_frames"] == len(frames)
    # frame 0 (nobody followed), then every detect_every = 10 frames while 1 < max_people = 2
    assert gauges["live_detector_runs"] == 3
    # pose jobs for Sapiens2 still go to the tracked person (oldest keyframe first)
    assert any(isinstance(i, PoseJob) for o in outs for i in o)


def test_a_real_keyframe_corrects_shared_points_and_carries_keyframe_only_points(tmp_path, frames):
    stage = make_stage(tmp_path)
    outs = run(stage, frames[:6])
    base = live_of(outs[2])[0]
    # a "Sapiens2" pose of frame 2: the CPU points moved 8 px right, and face points
    keypoints = base.keypoints.copy()
    keypoints[:, 0] += 8.0
    nose = keypoints[INDEX["nose"], :2]
    keypoints[FACE, :2] = nose + np.linspace(-10, 10, len(FACE))[:, None]
    keypoints[FACE, 2] = 0.9
    tracks = stage.camera_tracks("cam")
    tracks.keyframes.append(Keyframe(base.track_id, 2, base.capture_ts_ns, keypoints))
    (now,) = live_of(run(stage, frames[6:7], start=6)[0])
    assert now.keyframe_seq == 2 and stage.gauges()["keyframes_fused"] == 1
    age_s = (at(6) - at(2)) / NS
    shoulder = INDEX["left_shoulder"]
    assert now.source[shoulder] == SOURCE_CPU
    assert now.keyframe_age_ms[shoulder] == pytest.approx(age_s * 1e3, rel=1e-4)
    plain = make_stage(tmp_path)  # the same frames without the keyframe
    (ref,) = live_of(run(plain, frames[:7])[6])
    shift = now.keypoints[shoulder, 0] - ref.keypoints[shoulder, 0]
    assert shift == pytest.approx(8.0 * 0.5 ** (age_s / 1.0), rel=1e-3)  # decays, 1 s half-life
    assert (now.source[FACE] == SOURCE_KEYFRAME).all()  # moved with the head's motion
    assert (now.keypoints[FACE, 2] > 0).all() and (ref.source[FACE] == SOURCE_ABSENT).all()


def test_a_keyframe_for_a_frame_nobody_followed_is_counted_not_fused(tmp_path, frames):
    stage = make_stage(tmp_path)
    run(stage, frames[:3])
    tracks = stage.camera_tracks("cam")
    keypoints = np.zeros((308, 3), np.float32)
    tracks.keyframes.append(Keyframe(99, 1, at(1), keypoints))  # no such track
    tracks.keyframes.append(Keyframe(0, 1, at(1) + 1, keypoints))  # no such frame
    (pose,) = live_of(run(stage, frames[3:4], start=3)[0])
    assert pose.keyframe_seq is None
    assert stage.gauges()["keyframes_unmatched"] == 2 and stage.gauges()["keyframes_fused"] == 0


def test_the_live_pose_on_the_wire_keeps_the_pose_parts_and_adds_its_columns(tmp_path, frames):
    (pose,) = live_of(run(make_stage(tmp_path), frames[:1])[0])
    msg = wire.decode(wire.encode_result(pose, pose.capture_ts_ns))
    topic, header, arrays = msg.topic, msg.header, msg.arrays
    assert (
        topic == "pose/cam"
        and header["live"] is True
        and header["landmark_models"] == ["body", "hands"]
    )
    assert header["track_id"] == pose.track_id and header["count"] == 308
    assert arrays["keypoints"].shape == (308, 3) and arrays["box"].shape == (4,)
    assert arrays["source"].dtype == np.int8 and arrays["source"].shape == (308,)
    np.testing.assert_array_equal(arrays["source"], pose.source)
    assert arrays["keyframe_age_ms"].dtype == np.float32


def test_live_needs_the_blazepose_person_detector(tmp_path):
    data_ = {
        "cameras": [{"name": "cam", "url": "synthetic:"}],
        "stages": [
            {"kind": "capture"},
            {"kind": "detect", "person": "roi", "person_regions": [
                {"name": "all", "x": 0, "y": 0, "w": 1, "h": 1, "normalized": True}],
             "live": {"enabled": True}},
        ],
    }  # fmt: skip
    with pytest.raises(ConfigError) as err:
        check_stages(parse_config(data_, tmp_path / "run.toml"))
    assert "stages[1].live: the per-frame pose follows people" in str(err.value)
    assert "needs person = 'blazepose', not 'roi'" in str(err.value)


def test_a_live_rigs_groups_are_posed_by_the_per_frame_poses_not_sapiens2_group_jobs(
    tmp_path, frames
):
    stage = make_stage(tmp_path)
    rig = RigGroups("hall", {"cam": 60.0, "other": 60.0}, pose_interval_ns=0, live=True)
    RigRegistry.of(stage.context).add(rig)
    outs = run(stage, frames[:4])
    groups = rig.posed_groups()
    assert len(groups) >= 3  # the last may still be open
    for items, group in zip(outs, groups, strict=False):
        (pose,) = live_of(items)
        assert group.jobs["cam"] == (pose.track_id,)  # the per-frame pose is its view's pose
    jobs = [i for o in outs for i in o if isinstance(i, PoseJob)]
    assert jobs and all(j.group is None for j in jobs)  # Sapiens2: keyframe refreshes only


def test_detect_keeps_each_tracks_newest_frame_only_for_a_model_that_refreshes_tracks(
    tmp_path, frames
):
    stage = make_stage(tmp_path)
    outs = run(stage, frames[:3])
    (pose,) = live_of(outs[2])
    newest = stage.camera_tracks("cam").newest[pose.track_id]
    assert (newest.seq, newest.capture_ts_ns) == (2, at(2))  # what a Sapiens2 job moves to
    np.testing.assert_array_equal(newest.box_xywh[:2], pose.box[:2])
    config = parse_config(
        {"cameras": [{"name": "cam", "url": "synthetic:"}], "stages": [{"kind": "capture"}]},
        tmp_path / "off.toml",
    )
    off = DetectOptions(face="none", pose=False, live={"enabled": True})
    quiet = Detect("detect", off, Context(config, Metrics()))
    run(quiet, frames[:3])
    assert not quiet.camera_tracks("cam").newest  # no refreshes: no frames held
