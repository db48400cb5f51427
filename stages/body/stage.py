"""The `body` stage: `pose3d/<rig>` results -> `body/<rig>` (docs/body.md).

Each Pose3DResult of its rig goes to stages.body.people.BodyPeople (one BodyTracker per rig
person id) on a worker thread; the BodyResult follows the pose3d result's seq, capture time
and deadline. The model is loaded once when the stage is built, from the set-up's file
(pipeline/assets.py `fetch_body_model`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from pipeline.assets import ANNY_MODEL, asset_path
from pipeline.config import NAME_PATTERN
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.queues import BoundedQueue, QueueClosed
from stages.body.fit import FitConfig
from stages.body.model import AnnyModel
from stages.body.people import BodyPeople
from stages.rig.pose3d import Pose3DResult


class BodyOptions(StageOptions):
    rig: str = Field(pattern=NAME_PATTERN)  # fits pose3d/<rig>, publishes body/<rig>
    window: int = Field(30, ge=1, le=100000)  # frames the phenotype is fitted over
    iterations: int = Field(6, ge=1, le=100)  # LM steps a frame
    robust_scale_m: float = Field(0.04, gt=0)  # the Cauchy loss's scale
    min_confidence: float = Field(0.3, ge=0, le=1)  # keypoints below are missing
    person_max_age: int = Field(30, ge=1)  # pose3d groups a body outlives its person


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

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
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
            await out.send(result)
