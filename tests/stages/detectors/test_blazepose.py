"""BlazePose's person detector on the astronaut image and on an empty scene."""

from __future__ import annotations

import numpy as np

from stages.detectors.blazeface import BlazeFace
from stages.detectors.blazepose import BlazePosePerson


def test_astronaut_is_one_person_whose_box_holds_her_face(astronaut_bgr):
    face = BlazeFace("short").detect(astronaut_bgr)
    d = BlazePosePerson().detect(astronaut_bgr)
    assert len(d) == 1
    assert d.scores[0] > 0.7  # docs/architecture.md: 0.81
    x, y, w, h = d.boxes[0]
    assert w > 300 and h > 300  # she fills most of the 512x512 image
    fx, fy, fw, fh = face.boxes[0]
    assert x <= fx and y <= fy and x + w >= fx + fw and y + h >= fy + fh
    hx, hy, hw, hh = d.extra["detector_boxes"][0]
    nose = face.keypoints[0, 2]
    assert hx < nose[0] < hx + hw  # the detector's head box is around her head
    assert abs((hy + hh / 2) - nose[1]) < hh
    hip, _, shoulder, _ = d.keypoints[0]
    assert shoulder[1] < hip[1]  # upright: shoulders above hips
    assert abs(d.extra["rotation"][0]) < 0.5


def test_no_person_in_a_blank_image_or_a_tiny_one():
    det = BlazePosePerson()
    assert len(det.detect(np.zeros((300, 200, 3), np.uint8))) == 0
    assert len(det.detect(np.full((2, 3, 3), 255, np.uint8))) == 0
