"""Face mesh landmarks (468) in an ROI from the body's face points, tracked from the previous
frame's mesh (google-ai-edge/mediapipe mediapipe/modules/face_landmark/face_landmark_cpu.pbtxt,
face_landmark_landmarks_to_roi.pbtxt, holistic_landmark/face_landmarks_from_pose_cpu.pbtxt).

Deviation from Holistic, on purpose: Holistic refines the ROI from the body with a short-range
face detector run inside it; here the first ROI is the body's face points (eyes, ears, mouth)
boxed (axis-aligned, rotated by the eye line, as upstream's DetectionsToRects) and doubled, and
every later one is the previous mesh's ROI (its box rotated by the eye corners 33 -> 263, x1.5)
while it still overlaps the ROI from the body (IoU >= 0.5 of the axis-aligned boxes). A face
flag under 0.5 drops the face.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from stages.landmarks.models import TfliteModel, face_landmark_model
from stages.landmarks.rects import Rect, axis_aligned_iou, normalize_radians

NUM_FACE = 468
MIN_FACE_FLAG = 0.5
BODY_FACE_POINTS = tuple(range(11))  # nose, eyes, ears, mouth corners (body.BODY_NAMES)
BODY_RIGHT_EYE, BODY_LEFT_EYE = 5, 2
MESH_RIGHT_EYE_OUTER, MESH_LEFT_EYE_OUTER = 33, 263  # face_landmark_landmarks_to_roi.pbtxt
FROM_BODY_SCALE = 2.0
FROM_MESH_SCALE = 1.5
MIN_TRACK_IOU = 0.5


@dataclass
class FaceLandmarks:
    """One face in image pixels: xy float64 [468, 2], the face flag, the ROI used."""

    xy: np.ndarray
    flag: float
    roi: Rect


def _eye_rotation(right_eye: np.ndarray, left_eye: np.ndarray) -> float:
    d = left_eye - right_eye
    return normalize_radians(0.0 - np.arctan2(-d[1], d[0]))


def _box_with_rotation(points: np.ndarray, rotation: float) -> Rect:
    """DetectionsToRectsCalculator: the points' axis-aligned box, given a rotation."""
    lo, hi = points.min(axis=0), points.max(axis=0)
    c, size = (lo + hi) / 2, hi - lo
    return Rect(float(c[0]), float(c[1]), float(size[0]), float(size[1]), rotation)


def roi_from_body(body_xy: np.ndarray) -> Rect:
    pts = body_xy[list(BODY_FACE_POINTS)]
    rotation = _eye_rotation(body_xy[BODY_RIGHT_EYE], body_xy[BODY_LEFT_EYE])
    return _box_with_rotation(pts, rotation).transformed(FROM_BODY_SCALE)


def roi_from_mesh(xy: np.ndarray) -> Rect:
    """face_landmark_landmarks_to_roi: the mesh's box rotated by the eye corners, x1.5."""
    rotation = _eye_rotation(xy[MESH_RIGHT_EYE_OUTER], xy[MESH_LEFT_EYE_OUTER])
    return _box_with_rotation(xy, rotation).transformed(FROM_MESH_SCALE)


class FaceLandmarker:
    def __init__(self, model: TfliteModel | None = None) -> None:
        self.model = model or face_landmark_model()

    def landmarks(
        self, image: np.ndarray, roi: Rect, colour_order: str = "bgr"
    ) -> FaceLandmarks | None:
        size = self.model.size
        crop = roi.crop(image, size)
        if colour_order == "bgr":
            crop = cv2.cvtColor(crop, cv2.COLOR_BGR2RGB)
        out = self.model.run(crop)
        flag = float(1.0 / (1.0 + np.exp(-float(out["presence"].reshape(-1)[0]))))
        if flag < MIN_FACE_FLAG:
            return None
        raw = out["landmarks"].reshape(NUM_FACE, 3)[:, :2].astype(np.float64)
        return FaceLandmarks(roi.to_image(raw, size), flag, roi)


class FaceTrack:
    """The face of one body across frames: `step(image, body_xy)`."""

    def __init__(self, landmarker: FaceLandmarker) -> None:
        self.landmarker = landmarker
        self.previous: FaceLandmarks | None = None

    def step(
        self, image: np.ndarray, body_xy: np.ndarray, colour_order: str = "bgr"
    ) -> FaceLandmarks | None:
        roi = roi_from_body(body_xy)
        if self.previous is not None:
            tracked = roi_from_mesh(self.previous.xy)
            if axis_aligned_iou(tracked, roi) >= MIN_TRACK_IOU:
                roi = tracked
        self.previous = self.landmarker.landmarks(image, roi, colour_order)
        return self.previous
