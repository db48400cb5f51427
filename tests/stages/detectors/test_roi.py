"""Fixed kiosk regions, and BlazeFace run inside a region of a larger frame."""

from __future__ import annotations

import numpy as np
import pytest

from stages.detectors.blazeface import BlazeFace
from stages.detectors.detections import DetectorError
from stages.detectors.roi import DetectInRegions, FixedRegions, Region


def test_fixed_regions_are_boxes_clipped_to_the_frame():
    regions = FixedRegions(
        [Region("door", 10, 20, 30, 40), Region("desk", 0.5, 0.5, 0.6, 0.6, normalized=True)]
    )
    d = regions.detect(np.zeros((100, 200, 3), np.uint8))
    np.testing.assert_array_equal(d.boxes, [[10, 20, 30, 40], [100, 50, 100, 50]])
    np.testing.assert_array_equal(d.scores, [1, 1])
    np.testing.assert_array_equal(d.extra["region"], [0, 1])


def test_bad_regions_are_clear_errors():
    with pytest.raises(DetectorError, match="'a'.*w, h > 0"):
        Region("a", 0, 0, 0, 10)
    with pytest.raises(DetectorError, match="unique"):
        FixedRegions([Region("a", 0, 0, 1, 1), Region("a", 1, 1, 1, 1)])
    with pytest.raises(DetectorError, match="'far' lies outside the 64x48 frame"):
        FixedRegions([Region("far", 500, 500, 10, 10)]).detect(np.zeros((48, 64, 3), np.uint8))


def test_blazeface_in_a_region_finds_a_small_face_in_a_big_frame(astronaut_bgr):
    # the astronaut shrunk to 128 px and pasted into a 1280x720 frame: her face is ~24 px,
    # too small for BlazeFace on the whole letterboxed frame, but large inside the region
    frame = np.zeros((720, 1280, 3), np.uint8)
    small = astronaut_bgr[::4, ::4]
    frame[500:628, 900:1028] = small
    whole = BlazeFace("short").detect(frame)
    assert len(whole) == 0
    det = DetectInRegions(BlazeFace("short"), [Region("kiosk", 880, 480, 170, 170)])
    d = det.detect(frame)
    assert len(d) == 1
    x, y, w, h = d.boxes[0]
    assert 900 + 40 < x + w / 2 < 900 + 70 and 500 + 20 < y + h / 2 < 500 + 45
    nose = d.keypoints[0, 2]
    assert x < nose[0] < x + w and y < nose[1] < y + h
    np.testing.assert_array_equal(d.extra["region"], [0])
