"""Person boxes from BlazePose's detector (MediaPipe pose_detection.tflite) with LiteRT.

The model detects a person through the head: its own box lies around the head and upper
chest (not a tight face box; on skimage's astronaut it sits ~50 px below BlazeFace's), and
its 4 keypoints are
the hip centre, a point on the circle enclosing the body, the shoulder centre and a point
on the upper-body circle. The person box is MediaPipe's pose ROI before rotation: a square
centred on the hip centre with side 2·|kp1 − kp0| scaled by 1.25 (pose_detection_to_roi),
clipped to the image. Input: letterboxed RGB in [-1, 1], 224x224.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.assets import asset_path
from stages.detectors.anchors import (
    POSE_DETECTION,
    DecodeOptions,
    ssd_anchors,
)
from stages.detectors.detections import DetectorOutput, xyxy_to_clipped_xywh
from stages.detectors.litert import TfliteSsd

POSE_KEYPOINTS = ("hip_centre", "body_scale", "shoulder_centre", "upper_body_scale")
ROI_SCALE = 1.25


class BlazePosePerson:
    """Persons in an image: `detect(image) -> DetectorOutput`.

    boxes are the person ROIs (see the module doc), keypoints the detector's 4 points,
    extra["detector_boxes"] the detector's own head boxes (float32 [N, 4] xywh) and
    extra["rotation"] the body's rotation in radians (0 = upright), as MediaPipe computes
    it from the hip centre -> body-scale vector.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        min_score: float = 0.5,
        nms_iou: float = 0.3,
    ) -> None:
        self.size = POSE_DETECTION.input_size
        self._anchors = ssd_anchors(POSE_DETECTION)
        self._decode = DecodeOptions(
            num_keypoints=4, scale=float(self.size), min_score=min_score, nms_iou=nms_iou
        )
        path = model_path if model_path is not None else asset_path("pose_detection.tflite")
        self._model = TfliteSsd(path, self.size, len(self._anchors), 12)

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        """image: uint8 [H, W, 3] in `colour_order` ("bgr" as Frame, or "rgb")."""
        raw, lb = self._model.detect_letterboxed(image, colour_order, self._anchors, self._decode)
        h, w = image.shape[:2]
        if len(raw.scores) == 0:
            return DetectorOutput.empty(4, POSE_KEYPOINTS)
        kp = lb.to_image(raw.keypoints)
        centre = kp[:, 0]
        radius = np.linalg.norm(kp[:, 1] - kp[:, 0], axis=-1)
        half = (radius * ROI_SCALE)[:, None]
        person = np.concatenate([centre - half, centre + half], axis=-1)
        dx, dy = (kp[:, 1] - kp[:, 0]).T
        rotation = np.pi / 2 - np.arctan2(-dy, dx)
        rotation = (rotation + np.pi) % (2 * np.pi) - np.pi
        heads = lb.to_image(raw.boxes.reshape(-1, 2, 2)).reshape(-1, 4)
        return DetectorOutput(
            boxes=xyxy_to_clipped_xywh(person, w, h),
            scores=raw.scores,
            keypoints=kp,
            names=POSE_KEYPOINTS,
            extra={
                "detector_boxes": xyxy_to_clipped_xywh(heads, w, h),
                "rotation": rotation.astype(np.float32),
            },
        )
