"""One camera's frame segments: a raw MJPEG stream (JPEG files back to back, what FFmpeg's
`mjpeg` demuxer and OpenCV's FFmpeg backend read) and a CSV sidecar, one line per frame:
`seq,capture_ts_ns,offset,length`. Both are written unbuffered, the JPEG before its line, so a
process killed mid-write leaves every line it finished pointing at a complete JPEG; readers
ignore a last line without its newline and a line past the end of the stream."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from pipeline.errors import NpucamError

FRAMES_DIR = "frames"  # a session's frames/<camera>/NNNNNN.mjpeg and .csv
VIDEO_SUFFIX = ".mjpeg"
INDEX_SUFFIX = ".csv"
INDEX_HEADER = b"seq,capture_ts_ns,offset,length\n"


class RecordingError(NpucamError):
    """A recording that cannot be read as asked: the message names the file and line."""


@dataclass(frozen=True)
class FrameEntry:
    """One recorded frame: where its JPEG is in its segment's stream."""

    seq: int
    capture_ts_ns: int
    offset: int
    length: int


def encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    """image: uint8 BGR [H, W, 3] -> JPEG bytes (OpenCV's libjpeg-turbo)."""
    ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RecordingError(f"JPEG encode failed for a frame of shape {image.shape}")
    return jpeg.tobytes()


class FrameSegmentWriter:
    """Appends frames to `<stem>.mjpeg` and their lines to `<stem>.csv`; OSError from a full
    or read-only disk goes to the caller."""

    def __init__(self, stem: Path) -> None:
        self.video_path = stem.with_suffix(VIDEO_SUFFIX)
        self.index_path = stem.with_suffix(INDEX_SUFFIX)
        self._video = open(self.video_path, "xb", buffering=0)  # noqa: SIM115 (kept open)
        try:
            self._index = open(self.index_path, "xb", buffering=0)  # noqa: SIM115
            self._index.write(INDEX_HEADER)
        except OSError:
            self._video.close()
            raise
        self.offset = 0
        self.frames = 0
        self.bytes = len(INDEX_HEADER)

    def append(self, seq: int, capture_ts_ns: int, jpeg: bytes) -> int:
        """Write one frame; the bytes it added to the segment."""
        _write_all(self._video, jpeg)
        line = f"{seq},{capture_ts_ns},{self.offset},{len(jpeg)}\n".encode()
        _write_all(self._index, line)
        self.offset += len(jpeg)
        self.frames += 1
        self.bytes += len(jpeg) + len(line)
        return len(jpeg) + len(line)

    def close(self) -> None:
        self._video.close()
        self._index.close()


def _write_all(f, data: bytes) -> None:
    """An unbuffered write may be short (a signal, a nearly full disk): write the rest."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise OSError(f"write to {f.name} made no progress")
        view = view[n:]


def read_index(index_path: Path) -> list[FrameEntry]:
    """The complete frames of a segment: the lines of its sidecar that end in a newline and
    whose JPEG lies within the stream as it is on disk."""
    video_size = os.path.getsize(index_path.with_suffix(VIDEO_SUFFIX))
    data = index_path.read_bytes()
    if not data.startswith(INDEX_HEADER):
        raise RecordingError(f"{index_path}: line 1: not a frame index (expected {INDEX_HEADER!r})")
    entries = []
    lines = data[len(INDEX_HEADER) :].split(b"\n")
    for number, line in enumerate(lines[:-1], start=2):  # the last piece has no newline
        try:
            seq, ts, offset, length = (int(field) for field in line.split(b","))
        except ValueError:
            raise RecordingError(f"{index_path}: line {number}: not seq,ts,offset,length") from None
        if offset + length > video_size:
            break
        entries.append(FrameEntry(seq, ts, offset, length))
    return entries


def read_frames(index_path: Path) -> Iterator[tuple[FrameEntry, bytes]]:
    """(entry, JPEG bytes) of every complete frame of a segment, in recorded order."""
    entries = read_index(index_path)
    with open(index_path.with_suffix(VIDEO_SUFFIX), "rb") as video:
        for entry in entries:
            video.seek(entry.offset)
            yield entry, video.read(entry.length)
