"""The toy's stages: a source of ToyJobs (numbered flat frames of one camera) and the
postprocess that turns ToyInferred into a published `toy/<camera>` result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from pipeline.graph import MapStage, Stage, StageOptions
from pipeline.messages import Result, now_ns
from tests.toymodel.runtime import ToyInferred, ToyJob


def toy_frame(i: int) -> np.ndarray:
    """uint8 BGR [16, 16, 3]: frame i's flat colour (i, 2i, 3i) mod 256."""
    return np.broadcast_to(np.array([i, 2 * i, 3 * i]) % 256, (16, 16, 3)).astype(np.uint8)


class ToySourceOptions(StageOptions):
    frames: int = Field(6, ge=1)


class ToySource(Stage):
    """Sends `frames` ToyJobs of camera "toycam", then ends."""

    Options = ToySourceOptions

    async def run(self, inbox, out) -> None:
        for i in range(self.options.frames):
            t = now_ns()
            await out.send(
                ToyJob(
                    camera="toycam",
                    seq=i,
                    capture_ts_ns=t,
                    deadline_ns=t + 60 * 10**9,
                    frame_size=(16, 16),
                    image=toy_frame(40 * i),
                )
            )
            await asyncio.sleep(0)


@dataclass(slots=True, kw_only=True)
class ToyResult(Result):
    """The toy's outputs of one frame, published on `toy/<camera>`."""

    kind: str = "toy"
    values: np.ndarray = field(default_factory=lambda: np.zeros(4, np.float32))

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        return [("values", np.asarray(self.values, np.float32))]


class ToyPost(MapStage):
    accepts = (ToyInferred,)

    def process(self, item: ToyInferred) -> list[ToyResult]:
        job = item.job
        return [
            ToyResult(
                camera=job.camera,
                seq=job.seq,
                capture_ts_ns=job.capture_ts_ns,
                deadline_ns=job.deadline_ns,
                backend=item.backend,
                model=item.model,
                synthetic=item.synthetic,
                values=item.output,
            )
        ]
