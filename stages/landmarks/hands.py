"""Hand landmarks (21 per hand) from the body's wrist, pinky and index landmarks, as MediaPipe
Holistic does it (google-ai-edge/mediapipe mediapipe/modules/holistic_landmark/
hand_landmarks_from_pose_cpu.pbtxt, hand_visibility_from_hand_landmarks_from_pose.pbtxt,
hand_recrop_by_roi_cpu.pbtxt, hand_landmarks_to_roi.pbtxt, calculators/
hand_detections_from_pose_to_rects_calculator.cc and roi_tracking_calculator.cc).

Per frame and hand: skip it when the body's wrist visibility is under 0.1; a re-crop ROI from
the three body points (centre on the estimated middle finger, rotated wrist -> middle finger
up, x2.7, shifted 0.1 towards the fingers) goes through hand_recrop.tflite, whose two points
give the hand ROI; the previous frame's hand ROI is kept instead while it is close to that one
(rotation 40 degrees, translation 0.2, scale 0.4, previous landmarks inside the re-crop ROI
shrunk by 10%). A hand flag under 0.5 drops the hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from stages.landmarks.models import TfliteModel, hand_landmark_model, hand_recrop_model
from stages.landmarks.rects import Rect, alignment_rect, bounding_rect, normalize_radians

HAND_NAMES = (
    "wrist", "thumb_cmc", "thumb_mcp", "thumb_ip", "thumb_tip", "index_mcp", "index_pip",
    "index_dip", "index_tip", "middle_mcp", "middle_pip", "middle_dip", "middle_tip",
    "ring_mcp", "ring_pip", "ring_dip", "ring_tip", "pinky_mcp", "pinky_pip", "pinky_dip",
    "pinky_tip",
)  # fmt: skip
# body landmark indices (wrist, pinky, index) per side (holistic_landmark_cpu.pbtxt)
BODY_HAND_POINTS = {"left": (15, 17, 19), "right": (16, 18, 20)}
MIN_WRIST_VISIBILITY = 0.1
MIN_HAND_FLAG = 0.5
RECROP_SCALE = 2.7
PALM_POINTS = (0, 1, 2, 3, 5, 6, 9, 10, 13, 14, 17, 18)  # hand_landmarks_to_roi.pbtxt


@dataclass
class HandLandmarks:
    """One hand in image pixels: xy float64 [21, 2] (MediaPipe's order, HAND_NAMES), the hand
    flag, and the ROI they came from."""

    xy: np.ndarray
    flag: float
    roi: Rect


def recrop_roi_from_body(wrist: np.ndarray, pinky: np.ndarray, index: np.ndarray) -> Rect:
    """HandDetectionsFromPoseToRectsCalculator (side 2 x |middle - wrist|, as in the 0.10.x
    releases) then RectTransformation scale 2.7, shift_y -0.1, square_long."""
    middle = (2.0 * index + pinky) / 3.0
    d = middle - wrist
    side = 2.0 * float(np.hypot(d[0], d[1]))
    rotation = normalize_radians(np.pi / 2 - np.arctan2(-d[1], d[0]))
    rect = Rect(float(middle[0]), float(middle[1]), side, side, rotation)
    return rect.transformed(RECROP_SCALE, shift_y=-0.1)


def roi_from_hand(xy: np.ndarray) -> Rect:
    """HandLandmarksToRoi: the palm points' rotated box (rotation wrist -> the mean of the
    middle MCP and the index/ring MCP mean), x2, shifted 0.1 towards the fingers."""
    palm = xy[list(PALM_POINTS)]
    wrist, index_mcp, middle_mcp, ring_mcp = palm[0], palm[4], palm[6], palm[8]
    target = ((index_mcp + ring_mcp) / 2 + middle_mcp) / 2
    rotation = normalize_radians(
        np.pi / 2 - np.arctan2(-(target[1] - wrist[1]), target[0] - wrist[0])
    )
    return bounding_rect(palm, rotation).transformed(2.0, shift_y=-0.1)


def keep_previous(prev_rect: Rect, prev_xy: np.ndarray, recrop: Rect) -> bool:
    """RoiTrackingCalculator with holistic's hand options: True keeps the previous frame's ROI."""
    rot_diff = abs((np.degrees(prev_rect.rotation - recrop.rotation) + 180) % 360 - 180)
    c, s = np.cos(-recrop.rotation), np.sin(-recrop.rotation)
    m = np.array([[c, -s], [s, c]])
    pc = m @ np.array([prev_rect.cx, prev_rect.cy])
    rc = m @ np.array([recrop.cx, recrop.cy])
    ok = rot_diff <= 40.0
    ok &= abs(pc[0] - rc[0]) <= recrop.w * 0.2 and abs(pc[1] - rc[1]) <= recrop.h * 0.2
    ok &= abs(prev_rect.w - recrop.w) <= recrop.w * 0.4
    ok &= abs(prev_rect.h - recrop.h) <= recrop.h * 0.4
    half = np.array([recrop.w, recrop.h]) * (1 - 0.1) / 2
    local = prev_xy @ m.T
    inside = (np.abs(local - rc) < half).all()
    return bool(ok and inside)


class HandLandmarker:
    """The hand-recrop and hand-landmark models: `recrop(image, roi)` and `landmarks(...)`."""

    def __init__(
        self, model: TfliteModel | None = None, recrop_model: TfliteModel | None = None
    ) -> None:
        self.model = model or hand_landmark_model()
        self.recrop_model = recrop_model or hand_recrop_model()

    def _rgb(self, image: np.ndarray, roi: Rect, size: int, colour_order: str) -> np.ndarray:
        crop = roi.crop(image, size)
        return cv2.cvtColor(crop, cv2.COLOR_BGR2RGB) if colour_order == "bgr" else crop

    def recrop(self, image: np.ndarray, roi: Rect, colour_order: str = "bgr") -> Rect:
        """hand_recrop_by_roi_cpu: the hand ROI from the re-crop model's two points."""
        size = self.recrop_model.size
        pts = self.recrop_model.run(self._rgb(image, roi, size, colour_order))["points"]
        xy = roi.to_image(pts.reshape(2, 2).astype(np.float64), size)
        return alignment_rect(xy[0], xy[1], -90.0).transformed(1.0, shift_y=-0.1)

    def landmarks(
        self, image: np.ndarray, roi: Rect, colour_order: str = "bgr"
    ) -> HandLandmarks | None:
        size = self.model.size
        out = self.model.run(self._rgb(image, roi, size, colour_order))
        flag = float(out["presence"].reshape(-1)[0])
        if flag < MIN_HAND_FLAG:
            return None
        raw = out["landmarks"].reshape(21, 3)[:, :2].astype(np.float64)
        return HandLandmarks(roi.to_image(raw, size), flag, roi)


class HandTrack:
    """One hand of one body, followed across frames: `step(image, body_xy, body_visibility)`."""

    def __init__(self, landmarker: HandLandmarker, side: str) -> None:
        if side not in BODY_HAND_POINTS:
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        self.landmarker = landmarker
        self.side = side
        self.previous: HandLandmarks | None = None

    def step(
        self,
        image: np.ndarray,
        body_xy: np.ndarray,
        body_visibility: np.ndarray,
        colour_order: str = "bgr",
    ) -> HandLandmarks | None:
        wrist, pinky, index = BODY_HAND_POINTS[self.side]
        if body_visibility[wrist] <= MIN_WRIST_VISIBILITY:
            self.previous = None
            return None
        pose_roi = recrop_roi_from_body(body_xy[wrist], body_xy[pinky], body_xy[index])
        roi = self.landmarker.recrop(image, pose_roi, colour_order)
        if self.previous is not None:
            prev_roi = roi_from_hand(self.previous.xy)
            if keep_previous(prev_roi, self.previous.xy, roi):
                roi = prev_roi
        self.previous = self.landmarker.landmarks(image, roi, colour_order)
        return self.previous
