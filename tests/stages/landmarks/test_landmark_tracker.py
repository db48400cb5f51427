"""stages/landmarks/tracker.py's detector schedule and schema.py's 308 mapping, with a scripted
detector and body model (no .tflite), and the models' load-time checks."""

from __future__ import annotations

import numpy as np
import pytest

from npu.models.sapiens2.keypoints import INDEX, NAMES
from stages.detectors.detections import DetectorError, DetectorOutput
from stages.landmarks.body import BodyLandmarks
from stages.landmarks.models import TfliteModel
from stages.landmarks.schema import HAND_TO_308, to_308
from stages.landmarks.tracker import LandmarkTracker

IMAGE = np.zeros((480, 640, 3), np.uint8)


def _person(cx: float) -> np.ndarray:
    """BlazePose detector keypoints of a person standing at x = cx."""
    return np.array([[cx, 300.0], [cx, 150.0], [cx, 200.0], [cx, 120.0]], np.float32)


class ScriptedDetector:
    def __init__(self, people: list[float]) -> None:
        self.people = people
        self.calls = 0

    def detect(self, image, colour_order="bgr") -> DetectorOutput:
        self.calls += 1
        kp = np.stack([_person(x) for x in self.people]) if self.people else np.zeros((0, 4, 2))
        n = len(self.people)
        return DetectorOutput(np.zeros((n, 4), np.float32), np.linspace(0.9, 0.6, n), kp)


class ScriptedBody:
    """Finds a body in every ROI, except on the frames listed in `lost` (by call count)."""

    def __init__(self, lost: set[int] = frozenset()) -> None:
        self.lost = lost
        self.calls = 0

    def landmarks(self, image, roi, colour_order="bgr"):
        self.calls += 1
        if self.calls in self.lost:
            return None
        xy = np.tile([roi.cx, roi.cy], (33, 1))
        aux = np.array([[roi.cx, roi.cy], [roi.cx, roi.cy - roi.h / 2.5]])
        return BodyLandmarks(xy, np.ones(33), np.ones(33), 1.0, aux, roi)


def test_detector_runs_only_until_someone_is_tracked_and_again_after_a_loss():
    det, body = ScriptedDetector([320.0]), ScriptedBody(lost={4})
    tracker = LandmarkTracker(det, max_people=1, body=body)
    counts = [len(tracker.step(IMAGE, (i + 1) / 30)) for i in range(8)]
    assert counts == [1, 1, 1, 0, 1, 1, 1, 1]  # lost on frame 4, found again on frame 5
    assert det.calls == 2 and tracker.detector_runs == 2


def test_below_max_people_the_detector_runs_every_detect_every_frames_and_skips_known_people():
    det = ScriptedDetector([100.0])
    tracker = LandmarkTracker(det, max_people=2, detect_every=5, body=ScriptedBody())
    for i in range(11):
        people = tracker.step(IMAGE, (i + 1) / 30)
    assert det.calls == 3  # frames 0, 5 and 10
    assert [p.track_id for p in people] == [0]  # the same person was not added twice
    det.people = [100.0, 500.0]
    for i in range(11, 16):
        people = tracker.step(IMAGE, (i + 1) / 30)
    assert sorted(p.track_id for p in people) == [0, 1]


def test_tracker_rejects_parts_without_body_or_unknown():
    with pytest.raises(DetectorError, match="parts"):
        LandmarkTracker(ScriptedDetector([]), parts=("hands",), body=ScriptedBody())
    with pytest.raises(DetectorError, match="parts"):
        LandmarkTracker(ScriptedDetector([]), parts=("body", "feet"), body=ScriptedBody())


def test_308_mapping_places_body_and_hands_only_where_both_name_the_point():
    body = np.arange(66, dtype=np.float64).reshape(33, 2)
    vis = np.linspace(0.1, 0.9, 33)
    left = np.arange(42, dtype=np.float64).reshape(21, 2) + 1000
    xy, score = to_308(body, vis, {"left": (left, 0.8), "right": None})
    present = np.isfinite(xy).all(axis=1)
    assert present.sum() == 19 + 21 + 1  # body and feet, the left hand, the right wrist
    assert (score[~present] == 0).all()
    assert xy[INDEX["left_knee"]].tolist() == body[25].tolist()
    assert xy[INDEX["left_big_toe"]].tolist() == body[31].tolist()
    assert xy[INDEX["left_forefinger4"]].tolist() == left[8].tolist()  # index fingertip
    assert xy[INDEX["left_thumb_third_joint"]].tolist() == left[1].tolist()  # thumb CMC
    assert xy[INDEX["right_wrist"]].tolist() == body[16].tolist()  # no right hand: body wrist
    assert score[INDEX["left_wrist"]] == 0.8
    for name in ("neck", "left_olecranon", "left_small_toe", "tip_of_chin"):
        assert not present[INDEX[name]], name
    assert len(HAND_TO_308) == 21
    assert all(f"left_{k}" in NAMES for k in HAND_TO_308)


def test_a_model_file_of_the_wrong_shape_is_an_error_naming_it(tmp_path):
    from pipeline.assets import asset_path

    with pytest.raises(DetectorError, match="hand_recrop.tflite"):
        TfliteModel(asset_path("hand_recrop.tflite"), 224, {"points": (1, 1, 1, 4)})
    with pytest.raises(DetectorError, match="missing.tflite: landmark model not found"):
        TfliteModel(tmp_path / "missing.tflite", 256, {})
