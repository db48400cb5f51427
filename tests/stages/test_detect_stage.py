"""The detect stage: persons and faces on real images with track ids, the pose jobs that
refresh the oldest pose first, rate-limited CLIP jobs, and person boxes from an external
detector over ZeroMQ (malformed messages counted and skipped; the receiver's thread and
context closed when load fails and, off the event loop, when the stage is cancelled)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import zmq
from skimage import data

from npu import models
from pipeline.assets import asset_path
from pipeline.config import ConfigError, parse_config
from pipeline.graph import Context, Outbox, check_stages
from pipeline.messages import Detections, Frame, now_ns
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue
from stages import detect as detect_module
from stages.align import blazeface_alignment_points
from stages.box_receiver import BoxMessageError, BoxReceiver, BoxReceiverError, decode_box_message
from stages.detect import Detect, DetectOptions
from stages.detectors.blazeface import BlazeFace
from stages.detectors.litert import DetectorError
from stages.models.adaface.job import FaceJob
from stages.models.clip.job import ClipJob
from stages.models.sapiens2.job import PoseJob
from tests.toymodel import MODEL as TOY
from tests.toymodel.runtime import ToyJob

NS = 1_000_000_000


def make_stage(tmp_path: Path, cameras=("cam",), **options) -> Detect:
    config = parse_config(
        {
            "cameras": [{"name": c, "url": "synthetic:"} for c in cameras],
            "stages": [{"kind": "capture"}],
        },
        tmp_path / "run.toml",
    )
    return Detect("detect", DetectOptions(**options), Context(config, Metrics()))


def frame(image: np.ndarray, seq: int, t0: int, dt_s: float = 0.04, camera="cam", life=10 * NS):
    ts = t0 + round(seq * dt_s * NS)
    return Frame(camera, seq, ts, ts + life, image, source="test")


def split(items: list) -> tuple[Detections, list[PoseJob], list[FaceJob], list[ClipJob]]:
    det = items[0]
    assert isinstance(det, Detections)
    kinds = (PoseJob, FaceJob, ClipJob)
    assert all(isinstance(i, kinds) for i in items[1:])
    return (det, *([i for i in items[1:] if isinstance(i, k)] for k in kinds))


def contains(outer_xyxy: np.ndarray, inner_xyxy: np.ndarray) -> bool:
    return bool(
        np.all(outer_xyxy[:2] <= inner_xyxy[:2]) and np.all(inner_xyxy[2:] <= outer_xyxy[2:])
    )


def test_astronaut_gives_a_tracked_person_and_face_with_pose_face_and_clip_jobs(tmp_path):
    image = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    stage = make_stage(tmp_path, clip="persons")
    det, poses, faces, clips = split(stage.process(frame(image, 0, now_ns())))
    assert det.labels == ("person", "face") and det.camera == "cam" and det.seq == 0
    assert (det.width, det.height) == (512, 512) and det.backend == "cpu"
    person_id = det.extra["track_ids"][0]
    assert isinstance(person_id, int)
    assert det.extra["track_ids"][1] == person_id  # the face lies inside that person
    person, face = det.boxes
    assert contains(person, face)
    assert 150 < face[0] < face[2] < 300 and 50 < face[1] < face[3] < 200  # her face

    (pose,) = poses
    assert pose.track_id == person_id and pose.pose_age_s is None and pose.image is image
    np.testing.assert_allclose(pose.box_xywh, [*person[:2], *(person[2:] - person[:2])], 1e-5)
    (fj,) = faces
    assert fj.landmark_source == "blazeface" and fj.landmarks.shape == (4, 2)
    assert fj.track_id == person_id
    # the 4 alignment points are BlazeFace's own (eyes, nose, mouth centre), in the face box
    ref = BlazeFace("short").detect(image)
    np.testing.assert_allclose(fj.landmarks, blazeface_alignment_points(ref.keypoints[0]), 1e-4)
    x, y, w, h = fj.box_xywh
    assert np.all((fj.landmarks >= [x, y]) & (fj.landmarks <= [x + w, y + h]))
    (clip,) = clips
    assert clip.track_id == person_id
    np.testing.assert_allclose(clip.box_xywh, pose.box_xywh)


def test_carphone_clip_keeps_one_track_and_refreshes_its_pose_when_the_last_one_finishes(
    tmp_path,
):
    cap = cv2.VideoCapture(str(asset_path("carphone_pristine.mp4")))
    stage = make_stage(tmp_path)
    t0 = now_ns()
    ids, pose_jobs = set(), {}
    for seq in range(12):
        ok, image = cap.read()
        assert ok
        det, poses, faces, _ = split(stage.process(frame(image, seq, t0)))
        assert det.labels == ("person", "face"), f"frame {seq}: {det.labels}"
        ids.update(det.extra["track_ids"])
        assert len(faces) == 1 and faces[0].track_id == det.extra["track_ids"][0]
        assert len(poses) <= 1  # the default budget: one pose job per camera and frame
        if poses:
            pose_jobs[seq] = poses[0]
        if seq == 5:  # the pose of frame 0 comes back now
            job = pose_jobs[0]
            stage.camera_tracks("cam").finish_pose(job.track_id, job.capture_ts_ns, now_ns())
    cap.release()
    assert len(ids) == 1  # one person, one track, over every frame
    # a new track's job at frame 0; none while it runs; the next one right after it finished
    assert sorted(pose_jobs) == [0, 6]
    assert pose_jobs[0].pose_age_s is None
    assert pose_jobs[6].pose_age_s == pytest.approx(6 * 0.04, abs=1e-6)  # since frame 0's pose


def test_pose_jobs_go_to_the_oldest_pose_first_within_the_per_frame_budget(tmp_path):
    regions = [{"name": f"r{i}", "x": 10 + 60 * i, "y": 10, "w": 50, "h": 100} for i in range(3)]
    stage = make_stage(
        tmp_path, person="roi", person_regions=regions, face="none", pose_jobs_per_frame=2
    )
    image = np.zeros((120, 200, 3), np.uint8)
    t0 = now_ns()
    tracks = stage.camera_tracks("cam")

    def jobs(seq: int) -> list[PoseJob]:
        return split(stage.process(frame(image, seq, t0)))[1]

    f0 = jobs(0)
    assert [j.track_id for j in f0] == [1, 2]  # never-posed tracks first, budget 2
    f1 = jobs(1)
    assert [j.track_id for j in f1] == [3]  # 1 and 2 still running
    assert jobs(2) == []  # all three running
    tracks.finish_pose(3, f1[0].capture_ts_ns, now_ns())  # the newest pose
    tracks.finish_pose(2, f0[1].capture_ts_ns, now_ns())
    tracks.finish_pose(1, f0[0].capture_ts_ns, now_ns())
    f3 = jobs(3)
    assert [j.track_id for j in f3] == [1, 2]  # frame-0 poses are older than track 3's
    assert f3[0].pose_age_s == pytest.approx(0.12, abs=1e-6)  # frames 0 -> 3 at 25 fps
    tracks.finish_pose(1, f3[0].capture_ts_ns, now_ns())
    assert [j.track_id for j in jobs(4)] == [3, 1]  # track 3 (frame 1) before 1 (frame 3)


def test_pose_every_frame_poses_every_tracked_person_on_every_frame_on_that_frame(tmp_path):
    regions = [{"name": f"r{i}", "x": 10 + 60 * i, "y": 10, "w": 50, "h": 100} for i in range(3)]
    stage = make_stage(
        tmp_path, person="roi", person_regions=regions, face="none", pose_jobs_per_frame=1,
        pose_every_frame=True,
    )  # fmt: skip
    image = np.zeros((120, 200, 3), np.uint8)
    t0 = now_ns()
    for seq in range(3):  # no result comes back: every job is still in flight
        jobs = split(stage.process(frame(image, seq, t0)))[1]
        assert [(j.track_id, j.seq) for j in jobs] == [(1, seq), (2, seq), (3, seq)]
    # no newest frame is kept for a refresh to move to: each job stays on its own frame
    assert stage.camera_tracks("cam").newest == {}


def test_frames_up_to_jobs_after_are_tracked_but_make_no_jobs(tmp_path):
    regions = [{"name": f"r{i}", "x": 10 + 60 * i, "y": 10, "w": 50, "h": 100} for i in range(2)]
    stage = make_stage(
        tmp_path, person="roi", person_regions=regions, face="none", pose_every_frame=True,
        jobs_after={"cam": 1},
    )  # fmt: skip
    image = np.zeros((120, 200, 3), np.uint8)
    t0 = now_ns()
    for seq in (0, 1):
        det, jobs, _, _ = split(stage.process(frame(image, seq, t0)))
        assert jobs == [] and det.extra["track_ids"] == [1, 2]  # tracked as before
    assert [j.track_id for j in split(stage.process(frame(image, 2, t0)))[1]] == [1, 2]


def test_an_unanswered_pose_job_frees_its_track_at_its_deadline(tmp_path):
    stage = make_stage(
        tmp_path, person="roi", face="none",
        person_regions=[{"name": "door", "x": 0.1, "y": 0.1, "w": 0.5, "h": 0.8,
                         "normalized": True}],
    )  # fmt: skip
    image = np.zeros((100, 100, 3), np.uint8)
    t0 = now_ns() - NS  # frames a second old with a 10 ms staleness budget: already stale
    first = split(stage.process(frame(image, 0, t0, life=10_000_000)))[1]
    assert [j.track_id for j in first] == [1]
    # the infer stage dropped it as stale (no result ever comes): the next frame re-issues it
    again = split(stage.process(frame(image, 1, t0, life=10_000_000)))[1]
    assert [j.track_id for j in again] == [1]


def test_clip_jobs_of_whole_frames_are_rate_limited_per_camera(tmp_path):
    stage = make_stage(
        tmp_path, cameras=("a", "b"), person="none", face="none", clip="frame", clip_interval_s=1.0
    )
    image = np.zeros((48, 64, 3), np.uint8)
    t0 = now_ns()
    got = {}
    for seq in range(5):  # 0.0, 0.5, 1.0, 1.5, 2.0 s
        for cam in ("a", "b"):
            clips = split(stage.process(frame(image, seq, t0, dt_s=0.5, camera=cam)))[3]
            got.setdefault(cam, []).extend(c.seq for c in clips)
            for c in clips:
                np.testing.assert_array_equal(c.box_xywh, [0, 0, 64, 48])
                assert c.track_id is None and c.frame_size == (64, 48)
    assert got == {"a": [0, 2, 4], "b": [0, 2, 4]}


def test_a_registered_model_enabled_in_the_infer_stage_gets_jobs_on_the_targets_it_declares(
    tmp_path,
):
    config = parse_config(
        {
            "cameras": [{"name": "cam", "url": "synthetic:"}],
            "stages": [
                {"kind": "capture"},
                {"kind": "infer", "backend": "sim", "toy": {"enabled": True, "bundle": "t"}},
            ],
        },
        tmp_path / "run.toml",
    )
    door = {"name": "door", "x": 8, "y": 4, "w": 20, "h": 30}
    options = DetectOptions(person="roi", person_regions=[door], face="none", clip="frame")
    image = np.zeros((48, 64, 3), np.uint8)
    t0 = now_ns()
    models.register(TOY)
    try:
        stage = Detect("detect", options, Context(config, Metrics()))
        jobs = [stage.process(frame(image, seq, t0))[1:] for seq in range(3)]
    finally:
        models.unregister(TOY.name)
    # the toy runs on every tracked person of every frame (RunsOn("person", "frame")); the
    # released models are not enabled in this config's infer stage, so pose and CLIP get none
    assert [[type(j) for j in js] for js in jobs] == [[ToyJob]] * 3
    assert [j.seq for js in jobs for j in js] == [0, 1, 2]
    assert {j.track_id for js in jobs for j in js} == {jobs[0][0].track_id}
    assert all(j.image.shape == (30, 20, 3) for js in jobs for j in js)  # the person's box


# ---- person boxes from an external detector over ZeroMQ -----------------------------------

GOOD = {"camera": "cam", "boxes": [[10, 20, 30, 40]], "scores": [0.9], "seq": 5}


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"{not json", "not UTF-8 JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"boxes": []}).encode(), "'camera' must be a non-empty string"),
        (json.dumps({"camera": "nope", "boxes": []}).encode(), "camera 'nope' is not one of cam"),
        (json.dumps({"camera": "cam"}).encode(), "'boxes' must be a list"),
        (json.dumps({"camera": "cam", "boxes": [[1, 2, 3]]}).encode(), r"boxes\[0\] must be 4"),
        (json.dumps({"camera": "cam", "boxes": [[1, 2, 3, True]]}).encode(), r"boxes\[0\]"),
        (json.dumps({"camera": "cam", "boxes": [[1, 2, 0, 5]]}).encode(), "w, h > 0"),
        (b'{"camera": "cam", "boxes": [[1, 2, NaN, 5]]}', "needs finite float32 values"),
        (json.dumps({**GOOD, "scores": [0.5, 0.5]}).encode(), "'scores' must be 1 numbers"),
        (json.dumps({**GOOD, "scores": [1.5]}).encode(), r"scores must lie in \[0, 1\]"),
        (json.dumps({**GOOD, "seq": "5"}).encode(), "'seq' must be an integer"),
    ],
)
def test_malformed_box_messages_are_clear_errors(raw, match):
    with pytest.raises(BoxMessageError, match=match):
        decode_box_message(raw, ["cam"])


def test_a_box_message_decodes_with_default_scores():
    got = decode_box_message(json.dumps({"camera": "cam", "boxes": [[1, 2, 3, 4]]}).encode())
    np.testing.assert_array_equal(got.boxes, [[1, 2, 3, 4]])
    np.testing.assert_array_equal(got.scores, [1.0])
    assert got.seq is None and got.ts_ns is None


def test_external_boxes_drive_the_tracker_and_malformed_ones_are_counted(tmp_path, free_port):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    stage = make_stage(
        tmp_path, person="zmq", boxes_endpoint=endpoint, face="none", boxes_max_age_ms=5000
    )
    try:
        stage.load()
        receiver = stage.receiver
        assert isinstance(receiver, BoxReceiver)
        end = time.monotonic() + 10
        while receiver.received == 0 and time.monotonic() < end:  # PUB/SUB joins late
            pub.send_multipart([b"boxes", json.dumps(GOOD).encode()])
            time.sleep(0.05)
        assert receiver.received > 0
        for bad in (b"garbage", json.dumps({"camera": "cam", "boxes": [[1, 2]]}).encode()):
            pub.send(bad)
        pub.send(json.dumps({**GOOD, "boxes": [[12, 20, 30, 40]]}).encode())
        while receiver.received < 2 and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(0.1)
        assert receiver.malformed == 2
        drops = stage.metrics.snapshot()["stages"]["detect"]["drops"]
        assert drops["cam"]["error"] == 1 and drops[""]["error"] == 1  # garbage has no camera
        det, poses, _, _ = split(
            stage.process(frame(np.zeros((100, 100, 3), np.uint8), 0, now_ns()))
        )
        np.testing.assert_array_equal(det.boxes, [[12, 20, 42, 60]])
        assert det.labels == ("person",) and det.extra["track_ids"] == [1]
        assert [p.track_id for p in poses] == [1]
    finally:
        stage.close()
        pub.close()
        ctx.term()


def test_stale_external_boxes_are_not_used(tmp_path):
    stage = make_stage(tmp_path, person="zmq", boxes_endpoint="tcp://127.0.0.1:1", face="none",
                       boxes_max_age_ms=50)  # fmt: skip
    try:
        stage.load()
        assert stage.receiver.handle(json.dumps(GOOD).encode()) is not None
        time.sleep(0.1)
        det = stage.process(frame(np.zeros((50, 50, 3), np.uint8), 0, now_ns()))[0]
        assert det.boxes.shape == (0, 4)
    finally:
        stage.close()


async def run_stage(stage: Detect) -> None:
    """stage.run with an empty inbox (no producer yet) and an outbox to nowhere."""
    inbox = BoundedQueue(stage.name, 4, "block", stage.metrics)
    await stage.run(inbox, Outbox(stage.name, [], stage.metrics))


class RecordedReceiver(BoxReceiver):
    """A BoxReceiver that keeps every instance built and every one released, for the tests."""

    built: list[BoxReceiver] = []
    released: list[BoxReceiver] = []

    def __init__(self, *args, **kwargs) -> None:
        RecordedReceiver.built.append(self)
        super().__init__(*args, **kwargs)

    def _release(self) -> None:
        RecordedReceiver.released.append(self)
        super()._release()


@pytest.fixture
def recorded_receivers(monkeypatch):
    monkeypatch.setattr(RecordedReceiver, "built", [])
    monkeypatch.setattr(RecordedReceiver, "released", [])
    monkeypatch.setattr(detect_module, "BoxReceiver", RecordedReceiver)
    return RecordedReceiver


@pytest.mark.parametrize("via", ["run", "load"])  # the stage, or a lazy load in process()
def test_a_load_failure_after_the_box_receiver_started_closes_it(tmp_path, recorded_receivers, via):
    (tmp_path / "bad.tflite").write_bytes(b"not a model")
    stage = make_stage(
        tmp_path,
        person="zmq",
        boxes_endpoint="tcp://127.0.0.1:1",
        face="blazeface",
        face_model="bad.tflite",
    )
    with pytest.raises(DetectorError, match="bad.tflite"):
        if via == "run":
            asyncio.run(run_stage(stage))
        else:
            stage.load()
    [receiver] = recorded_receivers.built  # built before the face detector failed
    assert not receiver._thread.is_alive()
    assert receiver._ctx.closed
    assert stage.receiver is None


def test_a_box_receiver_that_cannot_connect_is_a_clear_error_and_closes_its_context(
    recorded_receivers,
):
    with pytest.raises(BoxReceiverError, match="detect boxes: cannot connect to nowhere:5"):
        recorded_receivers("nowhere:5", ["cam"])
    [receiver] = recorded_receivers.released
    assert receiver._ctx.closed


def test_cancelling_the_stage_closes_the_box_receiver_off_the_event_loop(
    tmp_path, free_port, monkeypatch
):
    """The receiver's thread is held inside a message until a ticker on the event loop has
    ticked 5 times: closing it on the loop would stall the ticker (and, here, never end)."""
    endpoint = f"tcp://127.0.0.1:{free_port}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    inside, release = threading.Event(), threading.Event()

    def held(receiver, raw):
        inside.set()
        release.wait(10)

    monkeypatch.setattr(BoxReceiver, "handle", held)
    stage = make_stage(tmp_path, person="zmq", boxes_endpoint=endpoint, face="none")
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1
            if ticks == 5:
                release.set()

    async def main():
        task = asyncio.create_task(run_stage(stage))
        end = time.monotonic() + 10
        while not inside.is_set() and time.monotonic() < end:  # PUB/SUB joins late
            pub.send(b"{}")
            await asyncio.sleep(0.02)
        assert inside.is_set()
        receiver = stage.receiver
        ticking = asyncio.create_task(ticker())
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # only the ticker sets `release` before the run ends: set, the close waited for the
        # ticker's 5th tick; a close on the loop would have stalled the ticker and waited out
        # the handler's 10 s hold instead
        released_by_ticker = release.is_set()
        ticking.cancel()
        return receiver, task.cancelled(), released_by_ticker

    try:
        receiver, cancelled, released_by_ticker = asyncio.run(main())
    finally:
        release.set()
        pub.close()
        ctx.term()
    assert cancelled and released_by_ticker
    assert not receiver._thread.is_alive() and receiver._ctx.closed
    assert stage.receiver is None


def test_config_check_names_the_missing_keys(tmp_path):
    data_ = {
        "cameras": [{"name": "cam", "url": "synthetic:"}],
        "stages": [
            {"kind": "capture"},
            {"kind": "detect", "person": "onnx", "face": "yunet", "face_model": "no.onnx",
             "cameras": ["cam", "ghost"]},
            {"kind": "detect", "name": "d2", "person": "zmq", "face": "roi"},
            {"kind": "publish"},
        ],
    }  # fmt: skip
    with pytest.raises(ConfigError) as err:
        check_stages(parse_config(data_, tmp_path / "bad.toml"))
    text = str(err.value)
    for line in (
        "stages[1].person_model: person = 'onnx' needs",
        "stages[1].face_model: no such file: no.onnx",
        "stages[1].cameras[1]: no camera named 'ghost'",
        "stages[2].boxes_endpoint: person = 'zmq' needs",
        "stages[2].face_regions: face = 'roi' needs",
    ):
        assert f"bad.toml: {line}" in text


def test_pose_retry_reissues_a_job_before_its_deadline(tmp_path):
    stage = make_stage(
        tmp_path, person="roi", face="none", pose_retry_s=0.05,
        person_regions=[{"name": "door", "x": 10, "y": 10, "w": 40, "h": 80}],
    )  # fmt: skip
    image = np.zeros((100, 100, 3), np.uint8)
    t0 = now_ns()
    assert [j.track_id for j in split(stage.process(frame(image, 0, t0)))[1]] == [1]
    assert split(stage.process(frame(image, 1, t0)))[1] == []  # running, 50 ms not over
    time.sleep(0.1)
    assert [j.track_id for j in split(stage.process(frame(image, 2, t0)))[1]] == [1]


def test_faces_inside_person_boxes_are_found_in_a_wide_frame(tmp_path):
    small = cv2.resize(cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR), (160, 160))
    canvas = np.zeros((360, 1280, 3), np.uint8)
    canvas[150:310, 900:1060] = small
    region = {"name": "booth", "x": 880, "y": 130, "w": 200, "h": 200}
    stage = make_stage(
        tmp_path, person="roi", person_regions=[region], face_in="persons", face_interval_s=1.0
    )
    t0 = now_ns()
    det, _, faces, _ = split(stage.process(frame(canvas, 0, t0)))
    assert det.labels == ("person", "face")
    (face,) = faces
    # her face sits at ~(178..272, 81..175) of 512 in the original: x 0.31 scale + offset
    x, y, w, h = face.box_xywh
    assert 940 < x < x + w < 1000 and 160 < y < y + h < 220
    assert face.track_id == det.extra["track_ids"][0] == det.extra["track_ids"][1]
    # face_interval_s: the next frame within the second gives det boxes but no face jobs
    det2, _, faces2, _ = split(stage.process(frame(canvas, 1, t0)))
    assert det2.labels == ("person", "face") and faces2 == []


def test_the_demo_wiring_with_a_fake_infer_delivers_every_result_kind(write_config):
    """detect -> align -> (fake) infer -> dark / face_match / clip_labels, in one run."""
    import asyncio

    from pipeline.config import load_config
    from pipeline.graph import Pipeline
    from stages.models.adaface.result import FaceResult
    from stages.models.clip.result import ClipResult
    from stages.models.sapiens2.result import PoseResult

    path = write_config(
        """
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "carphone"
        url = "sample:carphone_pristine.mp4"
        staleness_ms = 10000
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "detect"
        to = ["collect", "align"]
        clip = "persons"
        clip_interval_s = 0.2
        inbox = { size = 2, policy = "latest" }
        [[stages]]
        kind = "align"
        [[stages]]
        kind = "tests.stages.stream_fakes:FakeInfer"
        name = "infer"
        to = ["dark", "face_match", "clip_labels"]
        [[stages]]
        kind = "dark"
        to = ["collect"]
        [[stages]]
        kind = "face_match"
        to = ["collect"]
        [[stages]]
        kind = "clip_labels"
        to = ["collect"]
        [[stages]]
        kind = "engine_stages:Collect"
        name = "collect"
        inbox = { size = 1000, policy = "block" }
        """
    )
    pipeline = Pipeline(load_config(path))
    assert asyncio.run(pipeline.run(duration=3.0, handle_signals=False)) == 0
    items = pipeline.stages["collect"].items
    kinds = {type(i) for i in items}
    assert {Detections, PoseResult, FaceResult, ClipResult} <= kinds, kinds
    dets = [i for i in items if isinstance(i, Detections)]
    assert [d.seq for d in dets] == sorted(d.seq for d in dets)
    person_ids = {d.extra["track_ids"][0] for d in dets if d.labels[:1] == ("person",)}
    for r in items:
        if isinstance(r, PoseResult):
            assert r.track_id in person_ids and r.keypoints.shape == (17, 3)
            assert r.model == "fake-PoseJob" and r.synthetic
        if isinstance(r, ClipResult):
            assert abs(float(r.probabilities.sum()) - 1) < 1e-6 and r.track_id in person_ids
            # the fake's image embedding is label track_id % 3's text embedding
            assert r.top[0] == r.labels[r.track_id % 3]
    poses = [r for r in items if isinstance(r, PoseResult)]
    # one track: each pose after the first reports the time since the previous one
    assert poses[0].since_previous_ms is None
    assert all(p.since_previous_ms and p.since_previous_ms > 0 for p in poses[1:])


def test_faces_without_a_person_detector_carry_their_own_stable_track(tmp_path):
    """The kiosk (person = "none"): each face is tracked itself, so det's track_ids and the
    face jobs (hence face/ messages) name the same track on every frame."""
    cap = cv2.VideoCapture(str(asset_path("carphone_pristine.mp4")))
    stage = make_stage(tmp_path, person="none", pose=False)
    t0 = now_ns()
    ids = set()
    for seq in range(8):
        ok, image = cap.read()
        assert ok
        det, poses, faces, _ = split(stage.process(frame(image, seq, t0)))
        assert det.labels == ("face",) and not poses, f"frame {seq}: {det.labels}"
        (fj,) = faces
        assert isinstance(fj.track_id, int) and fj.track_id == det.extra["track_ids"][0]
        ids.add(fj.track_id)
    cap.release()
    assert len(ids) == 1
