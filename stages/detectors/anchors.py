"""SSD anchors, box/keypoint decoding and weighted NMS, as MediaPipe's detector graphs do.

Follows MediaPipe's SsdAnchorsCalculator (anchor centres per stride group, one anchor per
aspect ratio plus an interpolated one), TensorsToDetectionsCalculator (reverse_output_order
x, y, w, h; scores = sigmoid of the raw logit clipped to ±score_clipping_thresh) and
NonMaxSuppressionCalculator's WEIGHTED algorithm (overlapping boxes are averaged by score).
Coordinates stay normalised to the model input ([0, 1]) until the detector maps them back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AnchorOptions:
    """The SsdAnchorsCalculatorOptions of one MediaPipe detector graph."""

    input_size: int
    strides: tuple[int, ...]
    min_scale: float = 0.1484375
    max_scale: float = 0.75
    anchor_offset: float = 0.5
    aspect_ratios: tuple[float, ...] = (1.0,)
    interpolated_scale_aspect_ratio: float = 1.0
    fixed_anchor_size: bool = True


@dataclass(frozen=True)
class DecodeOptions:
    """The TensorsToDetectionsCalculatorOptions of one graph (scales = input size)."""

    num_keypoints: int
    scale: float
    min_score: float
    score_clipping: float = 100.0
    nms_iou: float = 0.3


# Values from MediaPipe's face_detection_short_range / full_range and pose_detection graphs;
# the anchor counts (896, 2304, 2254) match the models' output shapes.
FACE_SHORT_RANGE = AnchorOptions(input_size=128, strides=(8, 16, 16, 16))
FACE_FULL_RANGE = AnchorOptions(input_size=192, strides=(4,), interpolated_scale_aspect_ratio=0.0)
POSE_DETECTION = AnchorOptions(input_size=224, strides=(8, 16, 32, 32, 32))


def _scale(min_scale: float, max_scale: float, index: int, count: int) -> float:
    if count == 1:
        return (min_scale + max_scale) / 2.0
    return min_scale + (max_scale - min_scale) * index / (count - 1.0)


def ssd_anchors(opts: AnchorOptions) -> np.ndarray:
    """Anchors of an SSD head. Returns float32 [N, 4]: x_centre, y_centre, w, h (normalised).

    Layers sharing a stride share one feature map; each contributes one anchor per aspect
    ratio plus (when interpolated_scale_aspect_ratio > 0) one at the geometric mean scale.
    Order: stride group, then row, then column, then anchor, as MediaPipe emits them.
    """
    n = len(opts.strides)
    out: list[np.ndarray] = []
    layer = 0
    while layer < n:
        sizes: list[tuple[float, float]] = []
        last = layer
        while last < n and opts.strides[last] == opts.strides[layer]:
            scale = _scale(opts.min_scale, opts.max_scale, last, n)
            for ratio in opts.aspect_ratios:
                sizes.append((scale * math.sqrt(ratio), scale / math.sqrt(ratio)))
            if opts.interpolated_scale_aspect_ratio > 0.0:
                nxt = 1.0 if last == n - 1 else _scale(opts.min_scale, opts.max_scale, last + 1, n)
                s = math.sqrt(scale * nxt)
                r = math.sqrt(opts.interpolated_scale_aspect_ratio)
                sizes.append((s * r, s / r))
            last += 1
        stride = opts.strides[layer]
        fm = math.ceil(opts.input_size / stride)
        ys, xs = np.meshgrid(np.arange(fm), np.arange(fm), indexing="ij")
        cx = ((xs + opts.anchor_offset) / fm).reshape(-1, 1).repeat(len(sizes), axis=1)
        cy = ((ys + opts.anchor_offset) / fm).reshape(-1, 1).repeat(len(sizes), axis=1)
        wh = np.ones((len(sizes), 2)) if opts.fixed_anchor_size else np.array(sizes)
        w = np.broadcast_to(wh[:, 0], cx.shape)
        h = np.broadcast_to(wh[:, 1], cx.shape)
        out.append(np.stack([cx, cy, w, h], axis=-1).reshape(-1, 4))
        layer = last
    return np.concatenate(out).astype(np.float32)


@dataclass
class RawDetections:
    """Decoded detections in model-input normalised coordinates.

    boxes: float32 [N, 4] x_min, y_min, x_max, y_max; keypoints: float32 [N, K, 2] (x, y);
    scores: float32 [N].
    """

    boxes: np.ndarray
    keypoints: np.ndarray
    scores: np.ndarray


def decode(
    regressors: np.ndarray, logits: np.ndarray, anchors: np.ndarray, opts: DecodeOptions
) -> RawDetections:
    """Raw SSD outputs -> detections above opts.min_score (not yet suppressed).

    regressors: float32 [N, 4 + 2K] (x, y, w, h, then K keypoint x, y, in input pixels
    relative to the anchor); logits: float32 [N] or [N, 1]; anchors: float32 [N, 4].
    """
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    clipped = np.clip(logits, -opts.score_clipping, opts.score_clipping)
    scores = (1.0 / (1.0 + np.exp(-clipped))).astype(np.float32)
    keep = scores >= opts.min_score
    r = np.asarray(regressors, dtype=np.float32)[keep]
    a = anchors[keep]
    s = np.float32(opts.scale)
    cx = r[:, 0] / s * a[:, 2] + a[:, 0]
    cy = r[:, 1] / s * a[:, 3] + a[:, 1]
    w = r[:, 2] / s * a[:, 2]
    h = r[:, 3] / s * a[:, 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    k = opts.num_keypoints
    kp = r[:, 4 : 4 + 2 * k].reshape(-1, k, 2) / s
    kp = kp * a[:, None, 2:4] + a[:, None, 0:2]
    return RawDetections(boxes.astype(np.float32), kp.astype(np.float32), scores[keep])


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x0 = np.maximum(box[0], boxes[:, 0])
    y0 = np.maximum(box[1], boxes[:, 1])
    x1 = np.minimum(box[2], boxes[:, 2])
    y1 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def weighted_nms(dets: RawDetections, iou_threshold: float) -> RawDetections:
    """MediaPipe's WEIGHTED non-max suppression.

    Take the best remaining detection; every remaining one overlapping it by more than
    iou_threshold (itself included) is removed, and their boxes and keypoints are averaged
    with their scores as weights; the group keeps the best score. Output sorted by score.
    """
    order = np.argsort(-dets.scores, kind="stable")
    remaining = order
    boxes, kps, scores = [], [], []
    while remaining.size:
        best = remaining[0]
        overlap = _iou(dets.boxes[best], dets.boxes[remaining]) > iou_threshold
        overlap[0] = True
        group = remaining[overlap]
        w = dets.scores[group][:, None]
        boxes.append((dets.boxes[group] * w).sum(axis=0) / w.sum())
        kps.append((dets.keypoints[group] * w[:, :, None]).sum(axis=0) / w.sum())
        scores.append(dets.scores[best])
        remaining = remaining[~overlap]
    k = dets.keypoints.shape[1]
    return RawDetections(
        np.array(boxes, dtype=np.float32).reshape(-1, 4),
        np.array(kps, dtype=np.float32).reshape(-1, k, 2),
        np.array(scores, dtype=np.float32),
    )
