"""A toy camera source for the plug-in test (tests/test_toy_source.py): `npy:PATH` reads the
frames of a .npy array uint8 [N, H, W, 3] (BGR) in order, paced by the reader at the camera's
`fps`. Nothing of npucam is edited for it: KIND is its one registry entry
(stages.source_kinds.registry.register, or the npucam.sources entry point)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from stages.source_kinds.base import Source, SourceFailed
from stages.source_kinds.registry import SourceKind
from stages.source_kinds.spec import CameraSpec


def array_problem(path: Path) -> str | None:
    """Why path is not a readable uint8 [N, H, W, 3] .npy array with N >= 1, or None."""
    if not path.is_file():
        return f"file not found: {path}"
    try:
        frames = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        return f"{path}: not a .npy array: {exc}"
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or not len(frames):
        return f"{path}: expected uint8 [N, H, W, 3] with N >= 1, got {frames.dtype} {frames.shape}"
    return None


class NpySource(Source):
    """The frames of one .npy array, memory-mapped at open; the end of the array is the end
    of the source (a looping camera reopens it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = f"npy:{path}"
        self.frames: np.ndarray | None = None
        self.index = 0

    def open(self) -> None:
        problem = array_problem(self.path)
        if problem is not None:
            raise SourceFailed(problem)
        self.frames = np.load(self.path, mmap_mode="r", allow_pickle=False)
        self.index = 0

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        if self.frames is None or self.index >= len(self.frames):
            return None
        image = np.array(self.frames[self.index])  # a copy: the frame outlives the mapping
        self.index += 1
        return image, None, f"{self.description}#{self.index - 1}"

    def close(self) -> None:
        self.frames = None


class NpyKind(SourceKind):
    """target: PATH as written, relative to the config's folder. Probed by reading its first
    frames (as a video file is), so the plan takes the camera's `fps`."""

    name = "npy"
    schemes = ("npy",)
    forms = ("npy:",)

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> str:
        if not rest:
            raise spec.error("npy needs a file: npy:PATH")
        return rest

    def path(self, spec: CameraSpec) -> Path:
        return spec.base_dir / Path(spec.target).expanduser()

    def missing(self, spec: CameraSpec) -> str | None:
        problem = array_problem(self.path(spec))
        return None if problem is None else str(spec.error(problem))

    def open(self, spec: CameraSpec, stop: threading.Event) -> NpySource:
        return NpySource(self.path(spec))


KIND = NpyKind()
