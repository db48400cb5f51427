"""synthetic:[?width=W&height=H&fps=F]: a deterministic moving test card with the seq drawn in
it, for tests and demos without media."""

from __future__ import annotations

import cv2
import numpy as np

from stages.source_kinds.base import Source


class SyntheticSource(Source):
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
