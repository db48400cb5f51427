"""rtsp://, rtsps://, http://, https:// cameras: anything OpenCV's FFmpeg backend opens
(incl. HTTP MJPEG), read as fast as it delivers, with FFmpeg's open and read timeouts at the
camera's stall_timeout_s.

Notes from OpenCV 4.14's FFmpeg backend, checked by tests/stages/test_sources.py: a read that
times out leaves the capture dead, so a stream's read timeout is stall_timeout_s itself; a
read fails once per undecodable frame and the stream goes on; every frame of a stream is
scaled to the size it had when opened, so a size change shows only after a reopen. RTSP over
TCP is chosen with OpenCV's own variable OPENCV_FFMPEG_CAPTURE_OPTIONS="rtsp_transport;tcp".
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import TYPE_CHECKING

import cv2

from stages.source_kinds.opencv import CaptureSource
from stages.source_kinds.registry import SourceKind
from stages.source_kinds.spec import redact

if TYPE_CHECKING:
    from stages.source_kinds.spec import CameraSpec


class StreamKind(SourceKind):
    """target: the whole url. Live: probed by the rate frames arrive at."""

    name = "stream"
    schemes = ("rtsp", "rtsps", "http", "https")
    forms = ("rtsp://", "rtsps://", "http://", "https://")
    live = True
    probe = "live"

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> str:
        url = spec.url.strip()
        try:
            host = urllib.parse.urlsplit(url).hostname
        except ValueError:
            host = None
        if not rest.startswith("//") or not host:
            raise spec.error(f"a {scheme} url needs a host: {scheme}://HOST[:PORT]/PATH")
        return url

    def open(self, spec: CameraSpec, stop: threading.Event) -> CaptureSource:
        timeout_ms = int(spec.stall_timeout_s * 1000)
        # A read that times out leaves FFmpeg's context dead, so the read timeout is the stall
        # timeout itself: the stream is reopened exactly when it counts as stalled.
        params = [
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            timeout_ms,
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            timeout_ms,
        ]
        return CaptureSource(spec.target, redact(spec.target), params)


KIND = StreamKind()
