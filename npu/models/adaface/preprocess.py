"""An aligned 112 x 112 face -> the embedder's input: float32 CHW ((x/255) - 0.5) / 0.5 in the
colour order the backbone was trained on (cvlface's preprocessing; docs/face-id.md)."""

from __future__ import annotations

import numpy as np

from npu.models.adaface.config import AdaFaceError, ColourOrder


def convert_colour(crop: np.ndarray, have: ColourOrder, want: ColourOrder) -> np.ndarray:
    """Reorder the channels of crop: uint8 [H, W, 3] from `have` to `want` ("rgb"/"bgr")."""
    for order in (have, want):
        if order not in ("rgb", "bgr"):
            raise AdaFaceError(f"colour order must be 'rgb' or 'bgr', got {order!r}")
    return crop if have == want else np.ascontiguousarray(crop[..., ::-1])


def embedder_input(crop: np.ndarray, have: ColourOrder, want: ColourOrder = "rgb") -> np.ndarray:
    """An aligned crop -> the AdaFace/cvlface input ((x/255) - 0.5)/0.5, CHW (docs/face-id.md).

    crop: uint8 [H, W, 3] with channels in `have` order; want: the order the embedder
    expects (the model's colour_order()). Returns float32 [3, H, W] in [-1, 1].
    """
    if (
        not isinstance(crop, np.ndarray)
        or crop.dtype != np.uint8
        or crop.ndim != 3
        or (crop.shape[2] != 3 or crop.shape[0] < 1 or crop.shape[1] < 1)
    ):
        raise AdaFaceError(
            f"aligned face must be uint8 [H, W, 3], got {getattr(crop, 'dtype', type(crop))} "
            f"{getattr(crop, 'shape', '')}"
        )
    x = convert_colour(crop, have, want).astype(np.float32)
    x = (x / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    return np.ascontiguousarray(x.transpose(2, 0, 1))
