"""BlazePose person detection with MediaPipe's own input transform, for seeding landmark tracks
(google-ai-edge/mediapipe mediapipe/modules/pose_detection/pose_detection_cpu.pbtxt:
ImageToTensor 224x224, keep_aspect_ratio, zero border, bilinear; then the SSD decode and
weighted NMS of stages/detectors/anchors.py).

stages/detectors/blazepose.py shrinks with INTER_AREA instead; its keypoints differ by tens of
pixels on a partly visible person, and the landmark model, seeded from them, lands elsewhere
(bikes frame 0: 18% of body height from MediaPipe's landmarks, against 0.05% from this one).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from pipeline.assets import asset_path
from stages.detectors.anchors import (
    POSE_DETECTION,
    DecodeOptions,
    decode,
    ssd_anchors,
    weighted_nms,
)
from stages.detectors.blazepose import POSE_KEYPOINTS
from stages.detectors.detections import DetectorOutput, Letterbox, check_image
from stages.detectors.litert import TfliteSsd


def fit_to_square(image: np.ndarray, size: int) -> tuple[np.ndarray, Letterbox]:
    """image fitted into size x size, centred, keeping its aspect ratio: one bilinear affine
    warp with zero padding, as ImageToTensorCalculator with keep_aspect_ratio."""
    h, w = image.shape[:2]
    s = min(size / w, size / h)
    px, py = (size - w * s) / 2, (size - h * s) / 2
    m = np.array([[s, 0.0, px], [0.0, s, py]])
    out = cv2.warpAffine(image, m, (size, size), flags=cv2.INTER_LINEAR)
    return out, Letterbox(s, px, py, size)


class PoseDetector:
    """`detect(image)` -> DetectorOutput with BlazePose's 4 keypoints (image pixels), best
    score first; boxes are the keypoints' extent (the landmark path uses only keypoints)."""

    def __init__(
        self, model_path: str | Path | None = None, min_score: float = 0.5, nms_iou: float = 0.3
    ) -> None:
        self.size = POSE_DETECTION.input_size
        self._anchors = ssd_anchors(POSE_DETECTION)
        self._options = DecodeOptions(
            num_keypoints=4, scale=float(self.size), min_score=min_score, nms_iou=nms_iou
        )
        path = model_path if model_path is not None else asset_path("pose_detection.tflite")
        self._model = TfliteSsd(path, self.size, len(self._anchors), 12)

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        check_image(image)
        boxed, lb = fit_to_square(image, self.size)
        if colour_order == "bgr":
            boxed = cv2.cvtColor(boxed, cv2.COLOR_BGR2RGB)
        x = boxed.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        reg, logits = self._model.run(x[None])
        raw = weighted_nms(decode(reg, logits, self._anchors, self._options), self._options.nms_iou)
        if len(raw.scores) == 0:
            return DetectorOutput.empty(4, POSE_KEYPOINTS)
        order = np.argsort(-raw.scores)
        kp = lb.to_image(raw.keypoints[order])
        boxes = np.concatenate([kp.min(axis=1), kp.max(axis=1) - kp.min(axis=1)], axis=-1)
        return DetectorOutput(boxes.astype(np.float32), raw.scores[order], kp, POSE_KEYPOINTS)
