"""Video files (PATH, file:PATH relative to the config's folder; sample:NAME, a fetched asset
of pipeline/assets.py) read through OpenCV's FFmpeg backend frame by frame, the frames it
cannot decode counted against the container's frame count."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

from pipeline import assets
from pipeline.files import path_kind
from stages.source_kinds.base import BadFrame, SourceFailed, as_bgr
from stages.source_kinds.opencv import CaptureSource
from stages.source_kinds.registry import SourceKind

if TYPE_CHECKING:
    from stages.source_kinds.spec import CameraSpec


class FileKind(SourceKind):
    """target: ("path", PATH) or ("sample", NAME). Probed by reading its first frames."""

    name = "file"
    schemes = ("", "file", "sample")
    forms = ("a file path", "file:", "sample:")

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> tuple[str, str]:
        if scheme == "sample":
            if not rest or "/" in rest or "\\" in rest:
                raise spec.error("sample needs an asset name: sample:NAME (e.g. sample:bikes.mp4)")
            return "sample", rest
        if scheme == "file" and not rest:
            raise spec.error("file needs a path: file:PATH")
        return "path", rest

    def path(self, spec: CameraSpec) -> Path:
        how, value = spec.target
        if how == "sample":
            return assets.cache_dir() / value
        return spec.base_dir / Path(value).expanduser()

    def missing(self, spec: CameraSpec) -> str | None:
        """What `run` opens, opened the same way: a video file must give OpenCV a first
        frame."""
        how, value = spec.target
        if how == "sample":
            try:
                path = assets.asset_path(value)
            except assets.AssetError as exc:
                return str(exc)
            return not_video(path)
        path = self.path(spec)
        kind = path_kind(path)
        if kind == "missing":
            return f"file not found: {path}"
        if kind != "file":
            return f"{path}: is {kind}, not a video file"
        return not_video(path)

    def open(self, spec: CameraSpec, stop: threading.Event) -> FileSource:
        how, value = spec.target
        if how == "sample":
            try:
                assets.asset_path(value)
            except assets.AssetError as exc:
                raise spec.error(str(exc)) from None
        return FileSource(self.path(spec))


def not_video(path: Path) -> str | None:
    """None when OpenCV's FFmpeg backend opens path and decodes a first frame, as the
    camera's reader will; else why not."""
    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    try:
        if not cap.isOpened():
            return f"{path}: not a video OpenCV can open"
        ok, image = cap.read()
        if not ok or image is None:
            return f"{path}: OpenCV opens it but decodes no frame (not a video, or damaged)"
        return None
    finally:
        cap.release()


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
        count = self.opened().get(cv2.CAP_PROP_FRAME_COUNT)
        self.frame_count = int(count) if 0 < count < 1e9 else 0
        self.frames_read = 0

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        ok, image = self.opened().read()
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


KIND = FileKind()
