"""AdaFace IR-18 / IR-101 constants: the 112 x 112 input, the colour orders a backbone may be
trained on, and the error type of the model package (docs/face-id.md)."""

from __future__ import annotations

from typing import Literal

from pipeline.errors import NpucamError

ColourOrder = Literal["rgb", "bgr"]


BN_EPS = 1e-5  # torch BatchNorm's default, used by cvlface's iresnet


INPUT_SIZE = 112


class AdaFaceError(NpucamError):
    """A checkpoint that is not a cvlface-style IR network, or an input the forward rejects."""


def parse_colour_order(text: str, where: str) -> ColourOrder:
    """RGB / bgr (any case) -> the ColourOrder; AdaFaceError naming `where` otherwise."""
    order = text.lower()
    if order not in ("rgb", "bgr"):
        raise AdaFaceError(f"{where} must be RGB or BGR, not {text!r}")
    return order  # type: ignore[return-value]
