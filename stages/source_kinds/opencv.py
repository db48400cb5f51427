"""A camera read through cv2.VideoCapture (OpenCV 4.x, its FFmpeg backend for files and urls):
video files, USB devices and the streams FFmpeg opens."""

from __future__ import annotations

import cv2
import numpy as np

from stages.source_kinds.base import Source, SourceFailed, as_bgr


class CaptureSource(Source):
    """A cv2.VideoCapture: a video file, a USB device or a URL FFmpeg opens."""

    def __init__(self, target: str | int, description: str, params: list[int] | None = None):
        self.target = target
        self.description = description
        self.params = params
        self.cap: cv2.VideoCapture | None = None

    def open(self) -> None:
        if isinstance(self.target, int):
            cap = cv2.VideoCapture(self.target)
        elif self.params:
            cap = cv2.VideoCapture(self.target, cv2.CAP_FFMPEG, self.params)
        else:
            cap = cv2.VideoCapture(self.target, cv2.CAP_FFMPEG)
        if not cap.isOpened():
            cap.release()
            raise SourceFailed(f"cannot open {self.description}")
        self.cap = cap
        fps = cap.get(cv2.CAP_PROP_FPS)
        self.native_fps = fps if 0 < fps < 1000 else None

    def opened(self) -> cv2.VideoCapture:
        """The open capture; SourceFailed when read before open or after close."""
        if self.cap is None:
            raise SourceFailed(f"{self.description} is not open")
        return self.cap

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        ok, image = self.opened().read()
        if not ok:
            return None
        return as_bgr(image), None, self.description

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None
