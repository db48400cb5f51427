"""Faces blurred before storage (stages/record/privacy.py and the record stage's blur_faces):
only the face boxes (plus margin) change, shrunk to 12 pixels across and back; frames join their
Detections in either order; a frame detect skipped is never stored; and end to end every stored
frame is the blurred frame, every skipped one counted."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np
import pytest

from pipeline.config import ConfigError, load_config
from pipeline.graph import Pipeline, Stage, check_stages
from pipeline.messages import Detections, Frame
from stages.record.frame_log import read_frames
from stages.record.privacy import FaceJoin, blur_boxes, face_boxes
from stages.record.replay import session_folder
from stages.record.segments import segment_stems

FACE = np.array([[20.0, 10.0, 50.0, 40.0]], np.float32)


def _image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (64, 96, 3), np.uint8)


def test_only_the_grown_face_box_is_blurred_down_to_twelve_pixels_across():
    image = _image()
    out = blur_boxes(image, FACE, margin=0.2)
    # grown by 6 px each side: x 14..56, y 4..46 (42 x 42): area-averaged to 12 x 12, back up
    expected = image.copy()
    small = cv2.resize(image[4:46, 14:56], (12, 12), interpolation=cv2.INTER_AREA)
    expected[4:46, 14:56] = cv2.resize(small, (42, 42), interpolation=cv2.INTER_LINEAR)
    assert np.array_equal(out, expected)
    assert np.array_equal(image, _image())  # the frame others share is untouched


def test_the_blur_removes_the_fine_detail_of_the_region():
    image = _image()  # uniform noise: all detail is fine
    out = blur_boxes(image, FACE, margin=0.2)
    detail = [cv2.Laplacian(x[4:46, 14:56], cv2.CV_64F).std() for x in (image, out)]
    assert detail[1] < detail[0] / 10


def test_a_box_past_the_edge_is_clipped_and_no_boxes_leave_the_image_as_it_is():
    image = _image()
    out = blur_boxes(image, np.array([[80.0, 50.0, 200.0, 200.0]], np.float32), 0.0)
    assert np.array_equal(out[:50], image[:50]) and np.array_equal(out[:, :80], image[:, :80])
    assert blur_boxes(image, np.zeros((0, 4), np.float32), 0.2) is image


def _frame(seq, camera="a"):
    return Frame(camera, seq, seq, 1 << 62, _image(seq), "test")


def _det(seq, camera="a", faces=1):
    boxes = np.concatenate([np.array([[0, 0, 5, 5]], np.float32), np.repeat(FACE, faces, 0)])
    return Detections(
        camera=camera,
        seq=seq,
        capture_ts_ns=seq,
        deadline_ns=1 << 62,
        boxes=boxes,
        scores=np.ones(len(boxes), np.float32),
        labels=("person",) + ("face",) * faces,
    )


def test_face_boxes_are_the_boxes_labelled_face():
    assert face_boxes(_det(0, faces=2)).tolist() == [FACE[0].tolist()] * 2


def test_frames_join_their_detections_in_either_order_and_skipped_frames_are_given_up():
    join = FaceJoin(limit=8)
    assert join.frame(_frame(0)) == ([], [])
    ready, given_up = join.detections(_det(0))
    assert [f.seq for f, _ in ready] == [0] and given_up == []
    assert join.detections(_det(2)) == ([], [])  # ahead of its frame
    assert join.frame(_frame(1)) == ([], [])
    ready, given_up = join.frame(_frame(2))
    assert [f.seq for f, _ in ready] == [2] and ready[0][1].tolist() == FACE.tolist()
    assert [f.seq for f in given_up] == [1]  # detect skipped it: it will never match
    assert join.pending() == []


def test_at_most_limit_frames_wait_per_camera():
    join = FaceJoin(limit=2)
    given_up = [f.seq for seq in range(4) for f in join.frame(_frame(seq))[1]]
    assert given_up == [0, 1] and sorted(f.seq for f in join.pending()) == [2, 3]
    assert join.frame(_frame(0, camera="b")) == ([], [])  # cameras wait apart


class FaceBoxes(Stage):
    """A stand-in detect stage: a face box on every frame but each third, which it skips."""

    kind = "test_record_privacy:FaceBoxes"
    accepts = (Frame,)

    async def run(self, inbox, out) -> None:
        async for frame in inbox:
            if frame.seq % 3 != 2:
                await out.send(_det(frame.seq, frame.camera))


def test_stored_frames_are_the_blurred_frames_and_skipped_ones_are_counted(tmp_path, write_config):
    clip = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 25.0, (96, 64))
    for seq in range(12):
        writer.write(_image(seq))
    writer.release()
    cap = cv2.VideoCapture(str(clip), cv2.CAP_FFMPEG)
    originals = [cap.read()[1] for _ in range(12)]
    cap.release()
    path = write_config(
        f"""
        [[cameras]]
        name = "a"
        url = "{clip}"
        realtime = false
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        to = ["faces", "record"]
        [[stages]]
        kind = "test_record_privacy:FaceBoxes"
        name = "faces"
        to = ["record"]
        inbox = {{ size = 4, policy = "block" }}
        [[stages]]
        kind = "record"
        path = "rec"
        session = "s"
        blur_faces = true
        inbox = {{ size = 4, policy = "block" }}
        """
    )
    pipeline = Pipeline(load_config(path))
    assert asyncio.run(pipeline.run(duration=60, handle_signals=False)) == 0
    folder = session_folder(tmp_path / "rec" / "s") / "frames" / "a"
    stored = [x for s in segment_stems(folder, ".csv") for x in read_frames(s.with_suffix(".csv"))]
    assert [e.seq for e, _ in stored] == [s for s in range(12) if s % 3 != 2]
    for entry, jpeg in stored:
        blurred = blur_boxes(originals[entry.seq], FACE, 0.2)
        ok, expected = cv2.imencode(".jpg", blurred, [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert jpeg == expected.tobytes()
    assert pipeline.metrics.dropped("record", "a", "storage") == 4
    assert pipeline.stages["record"].unblurred_dropped == 4


def test_blur_faces_without_a_stage_sending_detections_is_a_config_error(tmp_path, write_config):
    path = write_config(
        """
        [[cameras]]
        name = "a"
        url = "synthetic:"
        [[stages]]
        kind = "capture"
        to = ["publish", "record"]
        [[stages]]
        kind = "publish"
        [[stages]]
        kind = "record"
        path = "rec"
        blur_faces = true
        """
    )
    config = load_config(path)
    with pytest.raises(ConfigError, match=r"stages\[2\]\.blur_faces: no stage but capture"):
        check_stages(config)
