"""synthetic:[?width=W&height=H&fps=F]: a deterministic moving test card with the seq drawn in
it, for tests and demos without media."""

from __future__ import annotations

import threading
import urllib.parse
from typing import TYPE_CHECKING

import cv2
import numpy as np

from stages.source_kinds.base import Source
from stages.source_kinds.registry import SourceKind

if TYPE_CHECKING:
    from stages.source_kinds.spec import CameraSpec

SYNTHETIC_DEFAULTS = {"width": 320, "height": 240, "fps": 25.0}


class SyntheticKind(SourceKind):
    """target: {"width", "height", "fps"}. The planner reads no frame: the query gives the
    rate and size."""

    name = "synthetic"
    schemes = ("synthetic",)
    forms = ("synthetic:",)
    probe = "known"

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> dict[str, float]:
        query = rest[1:] if rest.startswith("?") else rest
        if rest and not rest.startswith("?"):
            raise spec.error("synthetic takes only a query: synthetic:?width=W&height=H&fps=F")
        params = dict(SYNTHETIC_DEFAULTS)
        try:
            pairs = urllib.parse.parse_qsl(
                query, keep_blank_values=True, strict_parsing=bool(query)
            )
        except ValueError as exc:
            raise spec.error(f"synthetic query: {exc}") from None
        for key, value in pairs:
            if key not in params:
                raise spec.error(f"synthetic query: unknown key {key!r} (width, height, fps)")
            try:
                number = float(value) if key == "fps" else int(value)
            except ValueError:
                raise spec.error(
                    f"synthetic query {key}: expected a number, got {value!r}"
                ) from None
            limit = 1000.0 if key == "fps" else 8192
            if not 0 < number <= limit:
                raise spec.error(f"synthetic query {key}: must be in (0, {limit}], got {value}")
            params[key] = number
        return params

    def open(self, spec: CameraSpec, stop: threading.Event) -> SyntheticSource:
        t = spec.target
        return SyntheticSource(int(t["width"]), int(t["height"]), float(t["fps"]))

    def known_format(self, spec: CameraSpec) -> tuple[float, tuple[int, int]]:
        t = spec.target
        return float(t["fps"]), (int(t["width"]), int(t["height"]))


class SyntheticSource(Source):
    """The test card of synthetic_image at a fixed size and native rate."""

    def __init__(self, width: int, height: int, fps: float):
        self.width, self.height = width, height
        self.native_fps = fps
        self.description = f"synthetic:{width}x{height}@{fps:g}"

    def open(self) -> None:
        pass

    def read(self, seq: int) -> tuple[np.ndarray, None, str]:
        return synthetic_image(seq, self.width, self.height), None, self.description


def synthetic_image(seq: int, width: int, height: int) -> np.ndarray:
    """The synthetic source's frame seq: uint8 [height, width, 3] BGR, a function of its args.

    A diagonal gradient scrolls with seq, a white square crosses the frame, and seq is
    written in the top-left corner.
    """
    y, x = np.mgrid[0:height, 0:width]
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = (x + 3 * seq) % 256
    image[..., 1] = (y + 2 * seq) % 256
    image[..., 2] = ((x + y) // 2) % 256
    side = max(4, min(width, height) // 6)
    x0 = (seq * 5) % max(1, width - side)
    y0 = (height - side) // 2
    image[y0 : y0 + side, x0 : x0 + side] = 255
    scale = max(0.4, height / 240)
    cv2.putText(
        image,
        str(seq),
        (4, int(24 * scale)),
        cv2.FONT_HERSHEY_SIMPLEX,
        0.7 * scale,
        (0, 0, 0),
        max(1, int(2 * scale)),
    )
    return image


KIND = SyntheticKind()
