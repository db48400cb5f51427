"""A body stage's people over a run, for the files it writes at shutdown (docs/body.md,
"Exports"): per rig person the capture times, fitted keypoints, bone rotations, root
translation and last phenotype, then one file per person and format: OpenSim .trc
(stages/rig/trc.py), .mot (exports/mot.py), BVH (exports/bvh.py) and glTF of the last
frame's mesh (exports/gltf.py), each `<stem>_person<id>.<ext>`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import NpucamError
from stages.body.exports.bvh import write_bvh
from stages.body.exports.gltf import write_gltf
from stages.body.exports.mot import write_mot
from stages.body.model import AnnyModel
from stages.body.result import BodyResult
from stages.rig.trc import write_trc

log = logging.getLogger(__name__)


@dataclass
class PersonTrack:
    times: list[float] = field(default_factory=list)
    keypoints: list[np.ndarray] = field(default_factory=list)
    rotations: list[np.ndarray] = field(default_factory=list)
    translation: list[np.ndarray] = field(default_factory=list)
    phenotype: np.ndarray = field(default_factory=lambda: np.full(6, 0.5))


class BodyRecording:
    """Records BodyResults (at most max_frames per person) and writes the files asked for:
    paths maps a format (`trc`, `mot`, `bvh`, `gltf`) to its path stem."""

    def __init__(self, model: AnnyModel, paths: dict[str, Path], max_frames: int) -> None:
        self.model = model
        self.paths = paths
        self.max_frames = max_frames
        self.people: dict[int, PersonTrack] = {}
        self.names: tuple[str, ...] = ()

    def add(self, result: BodyResult) -> None:
        self.names = self.names or result.keypoint_names
        for p, person in enumerate(result.person_ids):
            self.add_frame(
                person,
                result.capture_ts_ns / 1e9,
                result.keypoints[p],
                result.rotations[p],
                result.translation[p],
                result.phenotype[p],
            )

    def add_frame(
        self,
        person: int,
        time_s: float,
        keypoints: np.ndarray,
        rotations: np.ndarray,
        translation: np.ndarray,
        phenotype: np.ndarray,
    ) -> None:
        """One person's fit at one instant (its phenotype replaces the one held before), kept
        at the float32 body/<rig> publishes (stages/body/result.py), so the files of a run
        and those made from its messages (stages/record/take.py) are the same."""
        track = self.people.setdefault(person, PersonTrack())
        track.phenotype = np.asarray(phenotype, np.float32).astype(np.float64)
        if len(track.times) < self.max_frames:
            track.times.append(time_s)
            track.keypoints.append(np.asarray(keypoints, np.float32))
            track.rotations.append(np.asarray(rotations, np.float32))
            track.translation.append(np.asarray(translation, np.float32).astype(np.float64))

    def write(self, stage: str) -> list[Path]:
        """Every asked format for every person fitted in at least 2 frames (the .trc and
        .mot need a rate); a failure is logged and the others still written."""
        writers: dict[str, Callable[[Path, PersonTrack], None]] = {
            "trc": self._trc,
            "mot": self._mot,
            "bvh": self._bvh,
            "gltf": self._gltf,
        }
        written = []
        for person, track in sorted(self.people.items()):
            if len(track.times) < 2:
                continue
            for fmt, base in self.paths.items():
                suffix = ".glb" if fmt == "gltf" else f".{fmt}"
                path = base.with_name(f"{base.stem}_person{person}{base.suffix or suffix}")
                try:
                    writers[fmt](path, track)
                except NpucamError as exc:
                    log.error("stage %s: %s", stage, exc)
                    continue
                log.info("stage %s: wrote %s (%d frames)", stage, path, len(track.times))
                written.append(path)
        return written

    def _trc(self, path: Path, track: PersonTrack) -> None:
        write_trc(path, np.stack(track.keypoints), np.asarray(track.times), names=self.names)

    def _mot(self, path: Path, track: PersonTrack) -> None:
        write_mot(path, self.model, np.asarray(track.times), *self._pose(track))

    def _bvh(self, path: Path, track: PersonTrack) -> None:
        write_bvh(path, self.model, track.phenotype, np.asarray(track.times), *self._pose(track))

    def _gltf(self, path: Path, track: PersonTrack) -> None:
        rest = self.model.rest(track.phenotype)
        rotations, translation = self._pose(track)
        posed = self.model.pose(rest, rotations[-1], translation[-1])
        write_gltf(path, [self.model.skin(rest, posed)], self.model.triangles, [path.stem])

    @staticmethod
    def _pose(track: PersonTrack) -> tuple[np.ndarray, np.ndarray]:
        return np.stack(track.rotations).astype(np.float64), np.stack(track.translation)
