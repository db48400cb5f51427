"""The detector result type and the letterbox every square-input detector shares.

A detector maps its model-input coordinates back to image pixels, so every consumer sees
boxes as x, y, w, h in the pixels of the frame it passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

from pipeline.errors import NpucamError


class DetectorError(NpucamError):
    """A detector model that cannot be loaded or run, or an image it cannot take."""


@dataclass
class DetectorOutput:
    """DetectorOutput in image pixels.

    boxes: float32 [N, 4] x, y, w, h (clipped to the image); scores: float32 [N] in [0, 1];
    keypoints: float32 [N, K, 2] (x, y), K = 0 when the detector gives none, not clipped
    (a point of a face at the border may lie outside the image); names: the K keypoint
    names in order; extra: per-detector arrays with N rows (e.g. BlazePose's face boxes).
    """

    boxes: np.ndarray
    scores: np.ndarray
    keypoints: np.ndarray
    names: tuple[str, ...] = ()
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    @staticmethod
    def empty(num_keypoints: int = 0, names: tuple[str, ...] = ()) -> DetectorOutput:
        return DetectorOutput(
            np.zeros((0, 4), np.float32),
            np.zeros((0,), np.float32),
            np.zeros((0, num_keypoints, 2), np.float32),
            names,
        )


def check_image(image: np.ndarray) -> None:
    """Raise DetectorError unless image is uint8 [H, W, 3] with H, W >= 1."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise DetectorError(f"image must be a uint8 numpy array, got {type(image).__name__}")
    if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
        raise DetectorError(f"image must be uint8 [H, W, 3], got shape {image.shape}")


@dataclass(frozen=True)
class Letterbox:
    """Where an image sits inside a square model input: input = image * scale + pad."""

    scale: float
    pad_x: float
    pad_y: float
    size: int

    def to_image(self, xy: np.ndarray) -> np.ndarray:
        """Normalised input coordinates [..., 2] -> image pixels [..., 2] (float32)."""
        px = np.asarray(xy, dtype=np.float32) * np.float32(self.size)
        out = np.empty_like(px)
        out[..., 0] = (px[..., 0] - self.pad_x) / self.scale
        out[..., 1] = (px[..., 1] - self.pad_y) / self.scale
        return out


def letterbox(image: np.ndarray, size: int) -> tuple[np.ndarray, Letterbox]:
    """Fit image into size x size keeping its aspect ratio, centred, zero padding.

    image: uint8 [H, W, 3]. Returns (uint8 [size, size, 3], the Letterbox to map back), as
    MediaPipe's ImageToTensorCalculator with keep_aspect_ratio (area resampling to shrink).
    """
    h, w = image.shape[:2]
    scale = min(size / w, size / h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    resized = cv2.resize(image, (nw, nh), interpolation=interp)
    px, py = (size - nw) // 2, (size - nh) // 2
    out = np.zeros((size, size, 3), np.uint8)
    out[py : py + nh, px : px + nw] = resized
    return out, Letterbox(nw / w, float(px), float(py), size)


def xyxy_to_clipped_xywh(xyxy: np.ndarray, width: int, height: int) -> np.ndarray:
    """float [N, 4] x0, y0, x1, y1 -> float32 [N, 4] x, y, w, h clipped to the image."""
    b = np.asarray(xyxy, dtype=np.float32).reshape(-1, 4).copy()
    b[:, [0, 2]] = np.clip(b[:, [0, 2]], 0, width)
    b[:, [1, 3]] = np.clip(b[:, [1, 3]], 0, height)
    return np.stack([b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]], axis=-1)
