"""BlazeFace (MediaPipe face_detection short-range and full-range) on CPU with LiteRT.

Letterboxed RGB input in [-1, 1], SSD decode and weighted NMS as MediaPipe's face_detection
graphs (stages.detectors.anchors), mapped back to image pixels. Six keypoints per face, in
MediaPipe's FaceKeyPoint order (the subject's right eye first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.assets import asset_path
from stages.detectors.anchors import (
    FACE_FULL_RANGE,
    FACE_SHORT_RANGE,
    AnchorOptions,
    DecodeOptions,
    ssd_anchors,
)
from stages.detectors.detections import (
    DetectorOutput,
    xyxy_to_clipped_xywh,
)
from stages.detectors.litert import TfliteSsd

FACE_KEYPOINTS = ("right_eye", "left_eye", "nose_tip", "mouth_centre", "right_ear", "left_ear")


@dataclass(frozen=True)
class BlazeFaceModel:
    """One BlazeFace variant: its file, anchors and MediaPipe's default score threshold."""

    filename: str
    anchors: AnchorOptions
    min_score: float


# min_score_thresh of MediaPipe's face_detection_short_range / full_range graphs.
SHORT_RANGE = BlazeFaceModel("face_detection_short_range.tflite", FACE_SHORT_RANGE, 0.5)
FULL_RANGE = BlazeFaceModel("face_detection_full_range.tflite", FACE_FULL_RANGE, 0.6)
VARIANTS = {"short": SHORT_RANGE, "full": FULL_RANGE}


class BlazeFace:
    """Faces in an image: `detect(image) -> DetectorOutput` with 6 keypoints per face.

    variant: "short" (faces within ~2 m, 128x128 input) or "full" (up to ~5 m, 192x192).
    model_path overrides the cached asset; min_score overrides the graph's threshold.
    """

    def __init__(
        self,
        variant: str = "short",
        model_path: str | Path | None = None,
        min_score: float | None = None,
        nms_iou: float = 0.3,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"BlazeFace variant must be one of {sorted(VARIANTS)}: {variant!r}")
        spec = VARIANTS[variant]
        self.variant = variant
        self.size = spec.anchors.input_size
        self._anchors = ssd_anchors(spec.anchors)
        self._decode = DecodeOptions(
            num_keypoints=6,
            scale=float(self.size),
            min_score=spec.min_score if min_score is None else min_score,
            nms_iou=nms_iou,
        )
        path = model_path if model_path is not None else asset_path(spec.filename)
        self._model = TfliteSsd(path, self.size, len(self._anchors), 16)

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        """image: uint8 [H, W, 3] in `colour_order` ("bgr" as Frame, or "rgb")."""
        raw, lb = self._model.detect_letterboxed(image, colour_order, self._anchors, self._decode)
        h, w = image.shape[:2]
        if len(raw.scores) == 0:
            return DetectorOutput.empty(6, FACE_KEYPOINTS)
        corners = lb.to_image(raw.boxes.reshape(-1, 2, 2)).reshape(-1, 4)
        return DetectorOutput(
            boxes=xyxy_to_clipped_xywh(corners, w, h),
            scores=raw.scores,
            keypoints=lb.to_image(raw.keypoints),
            names=FACE_KEYPOINTS,
        )
