"""SSD anchors, decoding and weighted NMS against hand-computed MediaPipe behaviour."""

from __future__ import annotations

import numpy as np

from stages.detectors.anchors import (
    FACE_FULL_RANGE,
    FACE_SHORT_RANGE,
    POSE_DETECTION,
    AnchorOptions,
    DecodeOptions,
    RawDetections,
    decode,
    ssd_anchors,
    weighted_nms,
)


def test_anchor_counts_match_the_models_outputs() -> None:
    assert ssd_anchors(FACE_SHORT_RANGE).shape == (896, 4)
    assert ssd_anchors(FACE_FULL_RANGE).shape == (2304, 4)
    assert ssd_anchors(POSE_DETECTION).shape == (2254, 4)


def test_short_range_anchor_layout_is_two_per_cell_then_six_per_cell() -> None:
    a = ssd_anchors(FACE_SHORT_RANGE)
    # stride 8: 16x16 cells, 2 anchors each, row-major; then stride 16: 8x8 cells, 6 each
    np.testing.assert_allclose(a[0], [0.5 / 16, 0.5 / 16, 1, 1])
    np.testing.assert_allclose(a[1], a[0])
    np.testing.assert_allclose(a[2], [1.5 / 16, 0.5 / 16, 1, 1])
    np.testing.assert_allclose(a[512], [0.5 / 8, 0.5 / 8, 1, 1])
    np.testing.assert_allclose(a[517], a[512])
    np.testing.assert_allclose(a[518], [1.5 / 8, 0.5 / 8, 1, 1])


def test_non_fixed_anchor_sizes_follow_scales() -> None:
    opts = AnchorOptions(input_size=64, strides=(32, 32), fixed_anchor_size=False)
    a = ssd_anchors(opts)
    assert a.shape == (2 * 2 * 4, 4)  # 2x2 cells, 2 layers x (ratio 1 + interpolated)
    np.testing.assert_allclose(a[0, 2:], [0.1484375, 0.1484375])
    np.testing.assert_allclose(a[1, 2:], np.sqrt(0.1484375 * 0.75))
    np.testing.assert_allclose(a[3, 2:], np.sqrt(0.75 * 1.0))


def test_decode_applies_anchor_offsets_scores_and_clipping() -> None:
    anchors = np.array([[0.25, 0.5, 1, 1], [0.75, 0.5, 1, 1]], np.float32)
    reg = np.zeros((2, 6), np.float32)
    reg[0] = [12.8, -6.4, 32, 64, 0, 12.8]  # input 128: +0.1 x, -0.05 y, w .25, h .5
    logits = np.array([1e6, -3.0], np.float32)  # clipped at 100 -> score 1.0; ~0.047
    d = decode(reg, logits, anchors, DecodeOptions(num_keypoints=1, scale=128, min_score=0.5))
    assert d.scores.shape == (1,)
    np.testing.assert_allclose(d.scores, [1.0])
    np.testing.assert_allclose(d.boxes[0], [0.35 - 0.125, 0.45 - 0.25, 0.35 + 0.125, 0.7])
    np.testing.assert_allclose(d.keypoints[0, 0], [0.25, 0.6])


def test_weighted_nms_averages_overlaps_by_score_and_keeps_the_best_score() -> None:
    boxes = np.array([[0, 0, 1, 1], [0.1, 0, 1.1, 1], [5, 5, 6, 6]], np.float32)
    kps = np.array([[[0, 0]], [[1, 1]], [[5, 5]]], np.float32)
    scores = np.array([0.9, 0.6, 0.7], np.float32)
    out = weighted_nms(RawDetections(boxes, kps, scores), iou_threshold=0.3)
    np.testing.assert_allclose(out.scores, [0.9, 0.7])
    np.testing.assert_allclose(out.boxes[0], [0.04, 0, 1.04, 1], atol=1e-6)
    np.testing.assert_allclose(out.keypoints[0, 0], [0.4, 0.4], atol=1e-6)
    np.testing.assert_allclose(out.boxes[1], [5, 5, 6, 6])


def test_weighted_nms_of_nothing_is_empty() -> None:
    out = weighted_nms(RawDetections(np.zeros((0, 4)), np.zeros((0, 6, 2)), np.zeros((0,))), 0.3)
    assert out.boxes.shape == (0, 4) and out.keypoints.shape == (0, 6, 2)
