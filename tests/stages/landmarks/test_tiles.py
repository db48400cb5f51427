"""stages/landmarks/tiles.py: where the tiles fall, detections mapped back from each tile, and
one person found by several passes kept once (the tracker's same_person rule)."""

from __future__ import annotations

import numpy as np
import pytest

from stages.detectors.detections import DetectorError, DetectorOutput
from stages.landmarks.body import roi_from_detection
from stages.landmarks.tiles import TiledDetector, tile_offsets
from stages.landmarks.tracker import same_person


def _person(x: float, y: float, radius: float = 150.0) -> np.ndarray:
    """BlazePose detector keypoints of an upright person with hips at (x, y)."""
    return np.array([[x, y], [x, y - radius], [x, y - radius / 2], [x, y - radius]], np.float32)


class PeopleInImage:
    """Finds the people whose hip centres lie inside the image it is given, in that image's
    pixels (the image's first row says which frame row it is), scoring them 0.05 higher in a
    square tile than in the whole frame, as a person larger in the input scores. Records the
    image sizes it was called on."""

    def __init__(self, hips: list[tuple[float, float, float]]) -> None:
        self.hips = hips  # (x, y, score) in frame pixels
        self.calls: list[tuple[int, int]] = []

    def detect(self, image, colour_order="bgr") -> DetectorOutput:
        h, w = image.shape[:2]
        y0 = int(image[0, 0, 0]) + 256 * int(image[0, 0, 1])
        self.calls.append((w, h))
        kps, scores = [], []
        for x, y, s in self.hips:
            if 0 <= x < w and y0 <= y < y0 + h:
                kps.append(_person(x, y - y0))
                scores.append(s + 0.05 * (w == h))
        n = len(kps)
        if not n:
            return DetectorOutput.empty(4)
        kp = np.stack(kps)
        boxes = np.concatenate([kp.min(1), kp.max(1) - kp.min(1)], axis=1)
        return DetectorOutput(boxes, np.array(scores, np.float32), kp)


def _frame(w: int, h: int) -> np.ndarray:
    frame = np.zeros((h, w, 3), np.uint8)
    rows = np.arange(h)[:, None]
    frame[:, :, 0], frame[:, :, 1] = rows % 256, rows // 256
    return frame


def test_square_tiles_cover_the_long_side_with_the_overlap_asked():
    assert tile_offsets(1088, 1920, 0.5) == [(0, 0), (0, 416), (0, 832)]
    assert tile_offsets(1920, 1088, 0.5) == [(0, 0), (416, 0), (832, 0)]
    assert tile_offsets(640, 640, 0.5) == []
    offsets = tile_offsets(100, 400, 0.25)  # step at most 75: 5 tiles over 300 rows
    assert [y for _, y in offsets] == [0, 75, 150, 225, 300]


def test_people_found_in_tiles_come_back_in_frame_pixels_once_each():
    frame = _frame(200, 400)
    # two people: one found by the whole frame and both tiles that hold it, one only lower
    detector = PeopleInImage([(100.0, 150.0, 0.9), (60.0, 360.0, 0.7)])
    tiled = TiledDetector(detector, overlap=0.5)
    out = tiled.detect(frame)
    assert detector.calls == [(200, 400), (200, 200), (200, 200), (200, 200)]
    assert tiled.passes == 4
    assert len(out) == 2
    np.testing.assert_allclose(out.keypoints[:, 0], [[100, 150], [60, 360]])
    np.testing.assert_allclose(out.scores, [0.95, 0.75])  # each kept from a tile


def test_two_people_side_by_side_stay_two_where_their_rois_overlap():
    a, b = _person(300, 900, 450), _person(700, 900, 450)  # 400 px apart, ROIs 1125 px
    ra, rb = roi_from_detection(a.astype(float)), roi_from_detection(b.astype(float))
    assert not same_person(ra, rb)
    assert same_person(ra, roi_from_detection(_person(330, 880, 420).astype(float)))


def test_a_detector_without_blazepose_keypoints_is_refused():
    class Boxes:
        def detect(self, image, colour_order="bgr"):
            return DetectorOutput(
                np.array([[0, 0, 10, 10]], np.float32),
                np.array([0.9], np.float32),
                np.zeros((1, 0, 2), np.float32),
            )

    with pytest.raises(DetectorError, match="keypoints"):
        TiledDetector(Boxes()).detect(_frame(50, 100))
    with pytest.raises(DetectorError, match="overlap"):
        TiledDetector(Boxes(), overlap=1.0)
