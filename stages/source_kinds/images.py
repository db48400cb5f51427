"""Image folders (images:DIR): the image files of a folder in sorted order, one frame each,
decoded with cv2.imread."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from stages.source_kinds.base import BadFrame, Source, SourceFailed

IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".pgm", ".ppm", ".tif", ".tiff", ".webp")


class ImageFolderSource(Source):
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
