"""Image folders (images:DIR): the image files of a folder in sorted order, one frame each,
decoded with cv2.imread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

from pipeline.files import path_kind
from stages.source_kinds.base import BadFrame, Source, SourceFailed
from stages.source_kinds.registry import SourceKind

if TYPE_CHECKING:
    from stages.source_kinds.spec import CameraSpec

IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".pgm", ".ppm", ".tif", ".tiff", ".webp")


class ImagesKind(SourceKind):
    """target: DIR as written (relative to the config's folder). Probed by reading its first
    images; paced only at the camera's `fps`."""

    name = "images"
    schemes = ("images",)
    forms = ("images:",)

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> str:
        if not rest:
            raise spec.error("images needs a folder: images:DIR")
        return rest

    def path(self, spec: CameraSpec) -> Path:
        return spec.base_dir / Path(spec.target).expanduser()

    def missing(self, spec: CameraSpec) -> str | None:
        path = self.path(spec)
        kind = path_kind(path)
        if kind == "missing":
            return f"folder not found: {path}"
        if kind != "directory":
            return f"{path}: is {'a file' if kind == 'file' else kind}, not a folder"
        try:
            names = [p.name for p in path.iterdir()]
        except OSError as exc:
            return f"{path}: cannot list the folder: {exc.strerror or exc}"
        if not any(Path(n).suffix.lower() in IMAGE_SUFFIXES for n in names):
            return f"{path}: no image files ({', '.join(IMAGE_SUFFIXES)})"
        return None

    def open(self, spec: CameraSpec, stop: threading.Event) -> ImageFolderSource:
        return ImageFolderSource(self.path(spec))


class ImageFolderSource(Source):
    """The image files of a folder in sorted order, listed again at each open."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.description = f"images:{folder}"
        self.files: list[Path] = []
        self.index = 0

    def open(self) -> None:
        if not self.folder.is_dir():
            raise SourceFailed(f"{self.folder}: no such folder")
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise SourceFailed(f"{self.folder}: no image files ({', '.join(IMAGE_SUFFIXES)})")
        self.index = 0

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        if self.index >= len(self.files):
            return None
        path = self.files[self.index]
        self.index += 1
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise BadFrame("bad_frames", f"{path}: cannot decode image")
        return image, None, f"images:{path}"


KIND = ImagesKind()
