"""Rotated regions of interest and the crops they define, in image pixels, as MediaPipe computes
them (google-ai-edge/mediapipe mediapipe/calculators/util/alignment_points_to_rects_calculator.cc,
rect_transformation_calculator.cc, tensors/image_to_tensor_calculator with its OpenCV converter).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from stages.detectors.detections import DetectorError, check_image

BORDER = cv2.BORDER_REPLICATE  # ImageToTensorCalculator's CPU default; zero border fits worse


def normalize_radians(angle: float) -> float:
    """Wrap to [-pi, pi) as MediaPipe's NormalizeRadians."""
    return float(angle - 2 * np.pi * np.floor((angle + np.pi) / (2 * np.pi)))


@dataclass(frozen=True)
class Rect:
    """A rotated rectangle in pixels: centre, size, clockwise rotation in radians (y down)."""

    cx: float
    cy: float
    w: float
    h: float
    rotation: float

    def transformed(
        self, scale: float, shift_y: float = 0.0, shift_x: float = 0.0, square_long: bool = True
    ) -> Rect:
        """RectTransformationCalculator: shift along the rect's own axes, square the long
        side, scale (rotation unchanged)."""
        c, s = np.cos(self.rotation), np.sin(self.rotation)
        dx = self.w * shift_x * c - self.h * shift_y * s
        dy = self.w * shift_x * s + self.h * shift_y * c
        w, h = self.w, self.h
        if square_long:
            w = h = max(w, h)
        return Rect(self.cx + dx, self.cy + dy, w * scale, h * scale, self.rotation)

    def crop_to_image(self, size: int) -> np.ndarray:
        """float64 [2, 3]: a size x size crop pixel (u, v) -> image pixel, as ImageToTensor's
        corner mapping (the crop's corners 0 and size land on the rect's corners)."""
        c, s = np.cos(self.rotation), np.sin(self.rotation)
        a = np.array([[c * self.w, -s * self.h], [s * self.w, c * self.h]]) / size
        t = np.array([self.cx, self.cy]) - a @ np.array([size / 2, size / 2])
        return np.concatenate([a, t[:, None]], axis=1)

    def crop(self, image: np.ndarray, size: int) -> np.ndarray:
        """The rect warped to uint8 [size, size, 3] (bilinear, border replicated)."""
        check_image(image)
        if not (self.w > 0 and self.h > 0 and np.isfinite([self.cx, self.cy]).all()):
            raise DetectorError(f"cannot crop an empty or non-finite rect {self}")
        return cv2.warpAffine(
            image,
            self.crop_to_image(size),
            (size, size),
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=BORDER,
        )

    def to_image(self, uv: np.ndarray, size: int) -> np.ndarray:
        """Crop pixels [..., 2] -> image pixels [..., 2] (float64)."""
        m = self.crop_to_image(size)
        return np.asarray(uv, np.float64) @ m[:, :2].T + m[:, 2]


def alignment_rect(centre: np.ndarray, scale_point: np.ndarray, target_deg: float) -> Rect:
    """AlignmentPointsRectsCalculator: a square centred on `centre` with side twice the
    distance to `scale_point`, rotated so that centre -> scale_point points at target_deg
    (90 = up)."""
    d = np.asarray(scale_point, np.float64) - np.asarray(centre, np.float64)
    side = 2.0 * float(np.hypot(d[0], d[1]))
    rotation = normalize_radians(np.deg2rad(target_deg) - np.arctan2(-d[1], d[0]))
    return Rect(float(centre[0]), float(centre[1]), side, side, rotation)


def bounding_rect(points: np.ndarray, rotation: float) -> Rect:
    """The tight box of points in the frame rotated by `rotation`, as
    HandLandmarksToRectCalculator / FaceLandmarksToRect (TargetRect over rotated points)."""
    p = np.asarray(points, np.float64)
    c, s = np.cos(rotation), np.sin(rotation)
    # rotate into the rect's axes (inverse rotation), box there, rotate the centre back
    local = p @ np.array([[c, -s], [s, c]])
    lo, hi = local.min(axis=0), local.max(axis=0)
    centre_local = (lo + hi) / 2
    centre = np.array([[c, -s], [s, c]]) @ centre_local
    size = hi - lo
    return Rect(float(centre[0]), float(centre[1]), float(size[0]), float(size[1]), rotation)


def axis_aligned_iou(a: Rect, b: Rect) -> float:
    """IoU of the axis-aligned boxes around two rotated rects."""

    def box(r: Rect) -> np.ndarray:
        corners = r.to_image(np.array([[0, 0], [1, 0], [1, 1], [0, 1]], np.float64), 1)
        return np.concatenate([corners.min(axis=0), corners.max(axis=0)])

    ba, bb = box(a), box(b)
    lo, hi = np.maximum(ba[:2], bb[:2]), np.minimum(ba[2:], bb[2:])
    inter = float(np.prod(np.clip(hi - lo, 0, None)))
    union = float(np.prod(ba[2:] - ba[:2]) + np.prod(bb[2:] - bb[:2])) - inter
    return inter / union if union > 0 else 0.0
