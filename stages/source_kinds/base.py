"""What every camera source is to its reader (stages/sources.py): open, read one item, close;
and the two ways a read fails short of the source's end."""

from __future__ import annotations

import cv2
import numpy as np


class SourceFailed(Exception):
    """The source cannot be opened now."""


class BadFrame(Exception):
    """One item could not be turned into an image; it is skipped and counted under `key`."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class Source:
    """How a reader talks to one kind of source; only the reader thread calls these."""

    description = ""
    native_fps: float | None = None
    # True: the capture times read() gives are the source's own timeline (a recording), taken
    # as they are; False: a sender's clock, re-stamped when far from this host's (sources.py)
    own_timeline = False

    def open(self) -> None:
        """Raise SourceFailed if the source cannot be opened now."""
        raise NotImplementedError

    def read(self, seq: int) -> tuple | None:
        """(image BGR uint8 [H, W, 3], capture_ts_ns or None = now, description) of the next
        item (seq is the number it will get), or with a 4th element the seq it carries
        itself (zmq: the sender's); None when no image came: the end, a frame OpenCV could
        not decode, a timed-out read or stop; BadFrame to skip one item."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the source; idempotent."""


def as_bgr(image: np.ndarray | None) -> np.ndarray:
    """image as uint8 [H, W, 3], or BadFrame when it is not an 8-bit image."""
    if image is None or image.size == 0 or image.dtype != np.uint8:
        raise BadFrame("bad_frames", "empty or non-8-bit frame")
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    if image.ndim == 3 and image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2BGR)
    if image.ndim != 3 or image.shape[2] != 3:
        raise BadFrame("bad_frames", f"frame of shape {image.shape} is not an image")
    return image
