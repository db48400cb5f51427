"""Video files (PATH, file:PATH, sample:NAME) read through OpenCV, frame by frame, with the
frames OpenCV cannot decode counted against the container's frame count."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from stages.source_kinds.base import BadFrame, SourceFailed, as_bgr
from stages.source_kinds.opencv import CaptureSource


class FileSource(CaptureSource):
    """A video file. A read that fails before the file's frame count (CAP_PROP_FRAME_COUNT,
    the container's) is reached is a frame that could not be decoded: skipped and counted
    (bad_frames); OpenCV reads on past it, as it does past damaged data. Without a frame
    count, failures in a row are the end (MAX_FAILED_READS)."""

    def __init__(self, path: Path):
        super().__init__(str(path), f"file:{path}")
        self.path = path
        self.frame_count = 0
        self.frames_read = 0  # this pass: decoded plus failed, against frame_count

    def open(self) -> None:
        if not self.path.is_file():
            raise SourceFailed(f"{self.path}: no such file")
        try:
            super().open()
        except SourceFailed:
            raise SourceFailed(
                f"cannot open {self.description}: not a video OpenCV can read"
            ) from None
        count = self.cap.get(cv2.CAP_PROP_FRAME_COUNT)
        self.frame_count = int(count) if 0 < count < 1e9 else 0
        self.frames_read = 0

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        ok, image = self.cap.read()
        self.frames_read += 1
        if ok:
            return as_bgr(image), None, self.description
        if self.frames_read <= self.frame_count:
            raise BadFrame(
                "bad_frames",
                f"{self.description}: frame {self.frames_read} of {self.frame_count} could not "
                "be decoded",
            )
        return None
