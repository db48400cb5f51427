"""A .tflite SSD detector run with the LiteRT interpreter (ai-edge-litert), on CPU.

Loading checks the model's input and output shapes against what the decoder expects, so a
wrong file is an error naming it rather than garbage detections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np

from stages.detectors.anchors import DecodeOptions, RawDetections, decode, weighted_nms
from stages.detectors.detections import DetectorError, Letterbox, check_image, letterbox


def open_interpreter(path: Path, size: int, what: str) -> tuple[Any, int]:
    """A LiteRT interpreter (one CPU thread) of a .tflite with a single float32 [1, S, S, 3]
    input, and that input's index; DetectorError names the file (`what` it should be) if it
    is missing, cannot load or has another input."""
    from ai_edge_litert.interpreter import Interpreter

    if not path.is_file():
        raise DetectorError(f"{path}: {what} not found")
    try:
        interp = Interpreter(model_path=str(path), num_threads=1)
        interp.allocate_tensors()
    except (ValueError, RuntimeError) as exc:
        raise DetectorError(f"{path}: not a loadable .tflite model: {exc}") from exc
    inputs = interp.get_input_details()
    if len(inputs) != 1 or tuple(inputs[0]["shape"]) != (1, size, size, 3):
        got = [tuple(d["shape"]) for d in inputs]
        raise DetectorError(f"{path}: expected one input [1,{size},{size},3], got {got}")
    return interp, inputs[0]["index"]


class TfliteSsd:
    """One loaded SSD .tflite: float32 [1, S, S, 3] input -> (regressors, score logits).

    Not thread-safe (one interpreter per detector object).
    """

    def __init__(self, path: str | Path, size: int, num_anchors: int, num_coords: int) -> None:
        self.path = Path(path)
        self.size = size
        self._interp, self._input = open_interpreter(self.path, size, "detector model")
        self._regressors = self._scores = None
        for d in self._interp.get_output_details():
            shape = tuple(d["shape"])
            if shape == (1, num_anchors, num_coords):
                self._regressors = d["index"]
            elif shape == (1, num_anchors, 1):
                self._scores = d["index"]
        if self._regressors is None or self._scores is None:
            got = [tuple(d["shape"]) for d in self._interp.get_output_details()]
            raise DetectorError(
                f"{self.path}: expected outputs [1,{num_anchors},{num_coords}] and "
                f"[1,{num_anchors},1], got {got}"
            )

    def run(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x: float32 [1, S, S, 3] -> (float32 [A, C] regressors, float32 [A] logits)."""
        self._interp.set_tensor(self._input, np.ascontiguousarray(x, dtype=np.float32))
        self._interp.invoke()
        reg = self._interp.get_tensor(self._regressors)[0]
        logits = self._interp.get_tensor(self._scores)[0, :, 0]
        return reg.copy(), logits.copy()

    def detect_letterboxed(
        self,
        image: np.ndarray,
        colour_order: str,
        anchors: np.ndarray,
        options: DecodeOptions,
    ) -> tuple[RawDetections, Letterbox]:
        """Letterbox image (uint8 [H, W, 3], "bgr" or "rgb") to the model's square RGB input
        in [-1, 1], run it, decode against anchors and weighted-NMS the result. Boxes and
        keypoints are in letterbox pixels; the returned Letterbox maps them to the image."""
        check_image(image)
        boxed, lb = letterbox(image, self.size)
        if colour_order == "bgr":
            boxed = cv2.cvtColor(boxed, cv2.COLOR_BGR2RGB)
        x = boxed.astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        reg, logits = self.run(x[None])
        return weighted_nms(decode(reg, logits, anchors, options), options.nms_iou), lb
