"""The MediaPipe landmark .tflite models on the LiteRT interpreter (one CPU thread each).

Input sizes and output shapes are read from the interpreter and checked against what the
decoders expect (google-ai-edge/mediapipe mediapipe/modules/*/..._by_roi_cpu.pbtxt), so a
wrong file is an error naming it. Inputs are RGB float32 in [0, 1] (the graphs'
output_tensor_float_range 0..1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.assets import asset_path
from stages.detectors.detections import DetectorError
from stages.detectors.litert import open_interpreter


class TfliteModel:
    """One .tflite with a single [1, S, S, 3] float32 input; outputs keyed by shape."""

    def __init__(self, path: str | Path, size: int, outputs: dict[str, tuple[int, ...]]) -> None:
        self.path = Path(path)
        self.size = size
        self._interp, self._input = open_interpreter(self.path, size, "landmark model")
        # several outputs share a shape (hand presence and handedness): match them in the order
        # of their names (Identity, Identity_1, ...), the order MediaPipe's graphs split them in
        details = sorted(self._interp.get_output_details(), key=lambda d: d["name"])
        self._outputs: dict[str, int] = {}
        used: set[int] = set()
        for key, shape in outputs.items():
            match = next(
                (d for d in details if tuple(d["shape"]) == shape and d["index"] not in used),
                None,
            )
            if match is None:
                got = [(d["name"], tuple(d["shape"])) for d in details]
                raise DetectorError(f"{self.path}: no output {key} of shape {shape}; has {got}")
            used.add(match["index"])
            self._outputs[key] = match["index"]

    def run(self, rgb: np.ndarray) -> dict[str, np.ndarray]:
        """rgb: uint8 [S, S, 3] -> each named output (float32, batch dimension kept)."""
        x = rgb.astype(np.float32)[None] * np.float32(1 / 255)
        self._interp.set_tensor(self._input, x)
        self._interp.invoke()
        return {k: self._interp.get_tensor(i).copy() for k, i in self._outputs.items()}


def pose_landmark_model(path: str | Path | None = None) -> TfliteModel:
    """pose_landmark_full: 39 x (x, y, z, visibility, presence) in 256-px crop units, the pose
    flag, the 64x64x39 heatmap (tensors_to_pose_landmarks_and_segmentation.pbtxt)."""
    return TfliteModel(
        path or asset_path("pose_landmark_full.tflite"),
        256,
        {"landmarks": (1, 195), "flag": (1, 1), "heatmap": (1, 64, 64, 39)},
    )


def hand_landmark_model(path: str | Path | None = None) -> TfliteModel:
    """hand_landmark_full: 21 x (x, y, z) in 224-px crop units, presence, handedness."""
    return TfliteModel(
        path or asset_path("hand_landmark_full.tflite"),
        224,
        {"landmarks": (1, 63), "presence": (1, 1), "handedness": (1, 1)},
    )


def hand_recrop_model(path: str | Path | None = None) -> TfliteModel:
    """hand_recrop: two points (crop centre, scale point) in 256-px crop units."""
    return TfliteModel(path or asset_path("hand_recrop.tflite"), 256, {"points": (1, 1, 1, 4)})


def face_landmark_model(path: str | Path | None = None) -> TfliteModel:
    """face_landmark: 468 x (x, y, z) in 192-px crop units and a face-presence logit."""
    return TfliteModel(
        path or asset_path("face_landmark.tflite"),
        192,
        {"landmarks": (1, 1, 1, 1404), "presence": (1, 1, 1, 1)},
    )
