"""The `body` stage: `pose3d/<rig>` results -> `body/<rig>` (docs/body.md).

Each Pose3DResult of its rig goes to stages.body.people.BodyPeople (one BodyTracker per rig
person id) on a worker thread; the BodyResult follows the pose3d result's seq, capture time
and deadline. The model is loaded once when the stage is built, from the set-up's file
(pipeline/assets.py `fetch_body_model`). With `trc`, each person's fitted keypoints are
written as an OpenSim .trc file at shutdown (stages.rig.trc, as rig3d's `trc`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from pipeline.assets import ANNY_MODEL, asset_path
from pipeline.config import NAME_PATTERN
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.queues import BoundedQueue, QueueClosed
from stages.body.fit import FitConfig
from stages.body.model import AnnyModel
from stages.body.people import BodyPeople
from stages.body.result import BodyResult
from stages.rig.pose3d import Pose3DResult
from stages.rig.trc import TrcError, write_trc

log = logging.getLogger(__name__)


class BodyOptions(StageOptions):
    rig: str = Field(pattern=NAME_PATTERN)  # fits pose3d/<rig>, publishes body/<rig>
    window: int = Field(30, ge=1, le=100000)  # frames the phenotype is fitted over
    iterations: int = Field(6, ge=1, le=100)  # LM steps a frame
    robust_scale_m: float = Field(0.04, gt=0)  # the Cauchy loss's scale
    min_confidence: float = Field(0.3, ge=0, le=1)  # keypoints below are missing
    person_max_age: int = Field(30, ge=1)  # pose3d groups a body outlives its person
    trc: str | None = Field(None, min_length=1)  # .trc path stem (relative to the config)
    trc_max_frames: int = Field(9000, ge=1)  # per person; later frames are not recorded


class Body(Stage[BodyOptions]):
    """Pose3DResult of one rig -> BodyResult on body/<rig> (module docstring)."""

    kind = "body"
    accepts = (Pose3DResult,)
    Options = BodyOptions

    def __init__(self, name: str, options: BodyOptions, context: Any) -> None:
        super().__init__(name, options, context)
        o = options
        config = FitConfig(
            window=o.window,
            iterations=o.iterations,
            robust_scale=o.robust_scale_m,
            min_confidence=o.min_confidence,
        )
        self.people = BodyPeople(AnnyModel.load(asset_path(ANNY_MODEL)), config, o.person_max_age)
        self._trc: dict[int, tuple[list[float], list[np.ndarray]]] = {}
        self._trc_names: tuple[str, ...] = ()

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
        try:
            while True:
                try:
                    item = await inbox.get()
                except QueueClosed:
                    return
                if item.camera != self.options.rig:
                    continue
                try:
                    result = await asyncio.to_thread(self.people.fit, item)
                except Exception:
                    self.item_failed(item)
                    continue
                if self.options.trc is not None:
                    self._record(result)
                await out.send(result)
        finally:
            if self.options.trc is not None:
                await asyncio.to_thread(self._write_trc)

    def _record(self, result: BodyResult) -> None:
        self._trc_names = self._trc_names or result.keypoint_names
        for p, person in enumerate(result.person_ids):
            times, frames = self._trc.setdefault(person, ([], []))
            if len(times) < self.options.trc_max_frames:
                times.append(result.capture_ts_ns / 1e9)
                frames.append(np.asarray(result.keypoints[p], np.float32))

    def _write_trc(self) -> None:
        """Each person's fitted keypoints as <trc stem>_person<id>.trc (one file per person,
        as Pose2Sim writes); a person fitted in fewer than 2 frames has no rate and no file."""
        assert self.options.trc is not None
        base = self.context.config.base_dir / self.options.trc
        for person, (times, frames) in sorted(self._trc.items()):
            path = base.with_name(f"{Path(base).stem}_person{person}{base.suffix or '.trc'}")
            try:
                write_trc(path, np.stack(frames), np.asarray(times), names=self._trc_names)
            except TrcError as exc:
                log.error("stage %s: %s", self.name, exc)
                continue
            log.info("stage %s: wrote %s (%d frames)", self.name, path, len(times))
