"""Person boxes from a user-supplied ONNX detector, run with OpenCV's dnn module on CPU.

The model gets a letterboxed RGB image scaled to [0, 1], NCHW (`blobFromImage`), and one of
three output formats, named by `output_format`:

- "yolov8" (also YOLO11 / ultralytics exports): one output [1, 4 + C, N] or [1, N, 4 + C]
  (the smaller axis is read as the attributes): cx, cy, w, h in input pixels, then C class
  scores already in [0, 1]. Score = scores[person_class].
- "yolov5" (also YOLOv7 / YOLOX-style with objectness): one output [1, N, 5 + C]: cx, cy, w,
  h in input pixels, objectness, C class probabilities. Score = objectness · p[person_class].
- "detr" (RF-DETR / DETR-style, no NMS needed): two outputs, boxes [1, N, 4] as cx, cy, w, h
  normalised to the input, and class logits [1, N, C]; score = sigmoid(logit[person_class]).
  The boxes output is the one whose last axis is 4.

YOLO formats then get OpenCV's NMSBoxes at `nms_iou`. Boxes come back in image pixels.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from stages.detectors.detections import (
    DetectorError,
    DetectorOutput,
    check_image,
    letterbox,
    xyxy_to_clipped_xywh,
)

FORMATS = ("yolov8", "yolov5", "detr")


class OnnxPersonDetector:
    """`detect(image) -> DetectorOutput` (no keypoints) from an ONNX person/object detector.

    input_size: the model's square input side; person_class: the class index of "person"
    (0 in COCO-80 YOLO exports; check your model's labels, e.g. 1 for COCO-91 ids).
    """

    def __init__(
        self,
        model_path: str | Path,
        output_format: str,
        input_size: int = 640,
        person_class: int = 0,
        min_score: float = 0.5,
        nms_iou: float = 0.45,
    ) -> None:
        if output_format not in FORMATS:
            raise DetectorError(f"output_format must be one of {FORMATS}: {output_format!r}")
        self.path = Path(model_path)
        if not self.path.is_file():
            raise DetectorError(f"{self.path}: ONNX person detector not found")
        try:
            self._net = cv2.dnn.readNetFromONNX(str(self.path))
        except cv2.error as exc:
            raise DetectorError(f"{self.path}: OpenCV cannot load this ONNX model: {exc}") from exc
        self.output_format = output_format
        self.input_size = int(input_size)
        self.person_class = int(person_class)
        self.min_score = float(min_score)
        self.nms_iou = float(nms_iou)

    def _forward(self, blob: np.ndarray) -> list[np.ndarray]:
        self._net.setInput(blob)
        try:
            return list(self._net.forward(self._net.getUnconnectedOutLayersNames()))
        except cv2.error as exc:
            raise DetectorError(f"{self.path}: forward failed: {exc}") from exc

    def _decode_yolo(self, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """-> (xyxy [N, 4] in input pixels, scores [N])."""
        a = np.asarray(out, dtype=np.float32)
        if a.ndim != 3 or a.shape[0] != 1:
            raise DetectorError(
                f"{self.path}: {self.output_format} output must be [1, *, *], got {a.shape}"
            )
        a = a[0]
        if self.output_format == "yolov8":
            if a.shape[0] < a.shape[1]:
                a = a.T  # [4 + C, N] -> [N, 4 + C]
            first_class = 4
        else:
            first_class = 5
        c = a.shape[1] - first_class
        if not 0 <= self.person_class < c:
            raise DetectorError(
                f"{self.path}: person_class {self.person_class} not among the {c} classes of "
                f"an output of shape {tuple(out.shape)} ({self.output_format})"
            )
        scores = a[:, first_class + self.person_class]
        if self.output_format == "yolov5":
            scores = scores * a[:, 4]
        cx, cy, w, h = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1), scores

    def _decode_detr(self, outs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        if len(outs) != 2:
            raise DetectorError(f"{self.path}: detr format needs 2 outputs, got {len(outs)}")
        boxes = [o for o in outs if o.ndim == 3 and o.shape[-1] == 4]
        logits = [o for o in outs if not (o.ndim == 3 and o.shape[-1] == 4)]
        if len(boxes) != 1 or len(logits) != 1 or logits[0].shape[:2] != boxes[0].shape[:2]:
            raise DetectorError(
                f"{self.path}: detr format needs boxes [1, N, 4] and logits [1, N, C], got "
                f"{[tuple(o.shape) for o in outs]}"
            )
        b, lg = boxes[0][0].astype(np.float32), logits[0][0].astype(np.float64)
        if not 0 <= self.person_class < lg.shape[1]:
            raise DetectorError(
                f"{self.path}: person_class {self.person_class} not among {lg.shape[1]} classes"
            )
        scores = (1.0 / (1.0 + np.exp(-np.clip(lg[:, self.person_class], -80, 80)))).astype(
            np.float32
        )
        s = np.float32(self.input_size)
        cx, cy, w, h = b[:, 0] * s, b[:, 1] * s, b[:, 2] * s, b[:, 3] * s
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1), scores

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        """image: uint8 [H, W, 3] in `colour_order`; the model gets RGB."""
        check_image(image)
        h, w = image.shape[:2]
        boxed, lb = letterbox(image, self.input_size)
        blob = cv2.dnn.blobFromImage(boxed, scalefactor=1.0 / 255.0, swapRB=(colour_order == "bgr"))
        outs = self._forward(blob)
        if self.output_format == "detr":
            xyxy, scores = self._decode_detr(outs)
        else:
            if len(outs) != 1:
                raise DetectorError(
                    f"{self.path}: {self.output_format} format needs 1 output, got {len(outs)}"
                )
            xyxy, scores = self._decode_yolo(outs[0])
        keep = np.nonzero(scores >= self.min_score)[0]
        xyxy, scores = xyxy[keep], scores[keep]
        if self.output_format != "detr" and len(keep):
            xywh = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1)
            idx = cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), self.min_score, self.nms_iou)
            idx = np.asarray(idx, dtype=np.int64).reshape(-1)
            xyxy, scores = xyxy[idx], scores[idx]
        order = np.argsort(-scores, kind="stable")
        xyxy, scores = xyxy[order], scores[order]
        if len(scores) == 0:
            return DetectorOutput.empty()
        corners = lb.to_image(xyxy.reshape(-1, 2, 2) / np.float32(self.input_size))
        return DetectorOutput(
            xyxy_to_clipped_xywh(corners.reshape(-1, 4), w, h),
            scores.astype(np.float32),
            np.zeros((len(scores), 0, 2), np.float32),
        )
