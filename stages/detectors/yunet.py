"""YuNet faces through cv2.FaceDetectorYN, when the user supplies its ONNX file.

No wheel ships YuNet weights (docs/architecture.md, "Assets"), so this needs a path, e.g.
opencv_zoo's face_detection_yunet_2023mar.onnx. detect() rows are N x 15: box x, y, w, h; five
points (right eye, left eye, nose tip, right mouth corner, left mouth corner, the subject's sides),
then the score; the points map onto the ArcFace template in order (docs/face-id.md), so
`keypoints[i]` is ready for stages.align.align_face.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from stages.detectors.detections import DetectorError, DetectorOutput, check_image

YUNET_KEYPOINTS = ("right_eye", "left_eye", "nose_tip", "right_mouth", "left_mouth")


def yunet_rows_to_detections(rows: np.ndarray | None, width: int, height: int) -> DetectorOutput:
    """FaceDetectorYN.detect output (float32 [N, 15] or None) -> DetectorOutput (5 keypoints)."""
    if rows is None or len(rows) == 0:
        return DetectorOutput.empty(5, YUNET_KEYPOINTS)
    rows = np.asarray(rows, dtype=np.float32).reshape(-1, 15)
    x0 = np.clip(rows[:, 0], 0, width)
    y0 = np.clip(rows[:, 1], 0, height)
    x1 = np.clip(rows[:, 0] + rows[:, 2], 0, width)
    y1 = np.clip(rows[:, 1] + rows[:, 3], 0, height)
    return DetectorOutput(
        np.stack([x0, y0, x1 - x0, y1 - y0], axis=-1),
        rows[:, 14].copy(),
        rows[:, 4:14].reshape(-1, 5, 2).copy(),
        YUNET_KEYPOINTS,
    )


class YuNet:
    """Faces with 5 landmarks from a user-supplied YuNet ONNX model (BGR input).

    score_threshold, nms_threshold and top_k are FaceDetectorYN's defaults (0.9, 0.3, 5000).
    """

    def __init__(
        self,
        model_path: str | Path,
        score_threshold: float = 0.9,
        nms_threshold: float = 0.3,
        top_k: int = 5000,
    ) -> None:
        self.path = Path(model_path)
        if not self.path.is_file():
            raise DetectorError(f"{self.path}: YuNet model not found (give its .onnx file)")
        try:
            self._det = cv2.FaceDetectorYN.create(
                str(self.path), "", (320, 320), score_threshold, nms_threshold, top_k
            )
        except cv2.error as exc:
            raise DetectorError(f"{self.path}: OpenCV cannot load it as YuNet: {exc}") from exc

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        """image: uint8 [H, W, 3] in `colour_order`; YuNet itself takes BGR."""
        check_image(image)
        if colour_order == "rgb":
            image = np.ascontiguousarray(image[..., ::-1])
        h, w = image.shape[:2]
        try:
            self._det.setInputSize((w, h))
            _, rows = self._det.detect(image)
        except cv2.error as exc:
            raise DetectorError(f"{self.path}: YuNet failed on a {w}x{h} image: {exc}") from exc
        return yunet_rows_to_detections(rows, w, h)
