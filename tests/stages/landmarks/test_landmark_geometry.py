"""stages/landmarks/rects.py, smoothing.py, body.refine_from_heatmap and hands.keep_previous:
MediaPipe's ROI arithmetic on hand-made cases."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from stages.detectors.detections import DetectorError
from stages.landmarks.body import refine_from_heatmap, roi_from_detection
from stages.landmarks.hands import keep_previous, recrop_roi_from_body
from stages.landmarks.rects import Rect, alignment_rect, bounding_rect
from stages.landmarks.smoothing import OneEuro


def test_alignment_rect_is_upright_when_the_scale_point_is_straight_above():
    r = alignment_rect(np.array([100.0, 200.0]), np.array([100.0, 150.0]), 90.0)
    assert (r.cx, r.cy, r.w, r.h) == (100.0, 200.0, 100.0, 100.0)
    assert r.rotation == pytest.approx(0.0)
    # tilted 90 degrees clockwise (scale point to the right): rotation +pi/2
    r = alignment_rect(np.array([0.0, 0.0]), np.array([10.0, 0.0]), 90.0)
    assert r.rotation == pytest.approx(np.pi / 2)


def test_pose_roi_from_detection_is_the_alignment_square_scaled_by_1_25():
    r = roi_from_detection(np.array([[50.0, 80.0], [50.0, 40.0], [0, 0], [0, 0]]))
    assert (r.cx, r.cy) == (50.0, 80.0) and r.w == pytest.approx(100.0) and r.h == r.w


def test_shift_moves_along_the_rect_own_axes():
    up = Rect(0.0, 0.0, 10.0, 10.0, 0.0).transformed(1.0, shift_y=-0.1)
    assert (up.cx, up.cy) == pytest.approx((0.0, -1.0))
    turned = Rect(0.0, 0.0, 10.0, 10.0, np.pi / 2).transformed(1.0, shift_y=-0.1)
    assert (turned.cx, turned.cy) == pytest.approx((1.0, 0.0))


def test_crop_and_to_image_are_inverse_maps_of_a_rotated_rect():
    image = np.zeros((200, 300, 3), np.uint8)
    image[118:123, 178:183] = 255  # a dot centred on (180, 120)
    roi = Rect(170.0, 110.0, 64.0, 64.0, 0.6)
    crop = roi.crop(image, 64)
    v, u = np.unravel_index(np.argmax(crop[..., 0].astype(float)), crop.shape[:2])
    back = roi.to_image(np.array([[u + 0.5, v + 0.5]]), 64)[0]
    assert np.linalg.norm(back - [180, 120]) < 1.5


def test_crop_refuses_an_empty_rect():
    with pytest.raises(DetectorError, match="empty"):
        Rect(5.0, 5.0, 0.0, 0.0, 0.0).crop(np.zeros((10, 10, 3), np.uint8), 8)


def test_bounding_rect_boxes_points_along_its_rotation():
    pts = np.array([[0.0, 0.0], [10.0, 0.0], [10.0, 4.0], [0.0, 4.0]])
    r = bounding_rect(pts, 0.0)
    assert (r.cx, r.cy, r.w, r.h) == pytest.approx((5.0, 2.0, 10.0, 4.0))
    r = bounding_rect(pts, np.pi / 2)  # the rect's x axis points down the image
    assert (r.w, r.h) == pytest.approx((4.0, 10.0))


def test_heatmap_refinement_moves_a_landmark_to_a_confident_peak_only():
    hm = np.full((64, 64, 2), -10.0, np.float32)
    hm[30, 40, 0] = 10.0  # landmark 0: one confident cell
    hm[30, 40, 1] = -0.5  # landmark 1: peak below 0.5 after the sigmoid
    xy = np.array([[41.5 / 64, 31.5 / 64], [41.5 / 64, 31.5 / 64]])
    out = refine_from_heatmap(xy, hm)
    assert out[0] == pytest.approx([40 / 64, 30 / 64], abs=2e-3)
    assert (out[1] == xy[1]).all()


def test_one_euro_passes_the_first_value_and_holds_a_still_point():
    f = OneEuro()
    pts = np.array([[10.0, 20.0], [30.0, 60.0]])
    assert (f.apply(1 / 30, pts) == pts).all()
    for i in range(2, 10):
        assert f.apply(i / 30, pts) == pytest.approx(pts)
    # a timestamp that does not advance passes the new value through untouched
    moved = pts + 5
    assert (f.apply(9 / 30, moved) == moved).all()


def test_one_euro_follows_a_jump_only_partly_at_first():
    f = OneEuro()
    pts = np.array([[0.0, 0.0], [100.0, 100.0]])
    f.apply(1 / 30, pts)
    f.apply(2 / 30, pts)
    out = f.apply(3 / 30, pts + 50)
    assert 0 < out[0, 0] < 50


def test_hand_roi_from_body_is_centred_on_the_estimated_middle_finger():
    wrist, pinky, index = np.array([0.0, 0.0]), np.array([-3.0, -9.0]), np.array([3.0, -9.0])
    r = recrop_roi_from_body(wrist, pinky, index)
    middle = (2 * index + pinky) / 3
    side = 2 * np.linalg.norm(middle - wrist) * 2.7
    assert r.w == pytest.approx(side) and r.h == pytest.approx(side)
    assert abs(r.rotation) < 0.2  # fingers up: nearly upright


def test_previous_hand_roi_is_kept_only_while_close_to_the_new_one():
    recrop = Rect(100.0, 100.0, 50.0, 50.0, 0.0)
    near = Rect(104.0, 100.0, 52.0, 52.0, 0.1)
    inside = np.array([[100.0, 100.0], [110.0, 90.0]])
    assert keep_previous(near, inside, recrop)
    assert not keep_previous(Rect(120.0, 100.0, 50.0, 50.0, 0.0), inside, recrop)  # moved 0.4
    assert not keep_previous(Rect(100.0, 100.0, 80.0, 80.0, 0.0), inside, recrop)  # grew 0.6
    assert not keep_previous(Rect(100.0, 100.0, 50.0, 50.0, 1.0), inside, recrop)  # turned 57deg
    assert not keep_previous(near, np.array([[124.0, 100.0]]), recrop)  # landmark near the edge


def test_flow_follows_a_shifted_texture_and_drops_points_that_fail_the_round_trip():
    from stages.landmarks import flow

    rng = np.random.default_rng(3)
    texture = cv2.GaussianBlur(rng.integers(0, 255, (240, 320), dtype=np.uint8), (5, 5), 1.5)
    shifted = np.roll(texture, (2, 3), axis=(0, 1))  # 3 px right, 2 px down
    shifted[:, 200:] = 128  # the texture on the right is gone: nothing to follow there
    pts = np.array([[100.0, 100.0], [150.0, 120.0], [260.0, 120.0], [np.nan, np.nan]])
    moved, ok = flow.track(texture, shifted, pts)
    assert ok.tolist() == [True, True, False, False]
    np.testing.assert_allclose(moved[:2], pts[:2] + [3, 2], atol=0.1)
    assert moved[2].tolist() == [260.0, 120.0]  # an untracked point keeps its position
