"""The toy's runtime: a ToyJob's image (a person's box cut from the frame, or a whole frame),
averaged on a 3 x 8 x 8 grid (RGB in [0, 1]), through the model; ToyInferred goes on to the
toy's postprocess stage (tests.toymodel.stages)."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from pipeline.messages import Frame
from stages.job_policy import Target
from stages.jobs import Inferred, Job, frame_fields
from stages.runtimes import Runtime


@dataclass(slots=True, kw_only=True)
class ToyJob(Job):
    """An image to run the toy on. image: uint8 BGR [H, W, 3]; track_id: the person's."""

    image: np.ndarray
    track_id: int | None = None


@dataclass(slots=True, kw_only=True)
class ToyInferred(Inferred):
    """The toy's 4 outputs of a ToyJob."""


def toy_input(image: np.ndarray) -> np.ndarray:
    """uint8 BGR [H, W, 3] -> float32 [3, 8, 8]: RGB in [0, 1], area-averaged."""
    small = cv2.resize(image[..., ::-1], (8, 8), interpolation=cv2.INTER_AREA)
    return (small.astype(np.float32) / 255).transpose(2, 0, 1).copy()


class ToyRuntime(Runtime):
    job_type = ToyJob
    inferred_type = ToyInferred

    @classmethod
    def make_job(cls, target: Target, frame: Frame) -> ToyJob:
        """A tracked person's box, cut from the frame (clipped to it)."""
        assert target.box_xywh is not None
        h, w = frame.image.shape[:2]
        x, y, bw, bh = (float(v) for v in target.box_xywh)
        x0, y0 = min(max(0, int(x)), w - 1), min(max(0, int(y)), h - 1)
        x1, y1 = max(x0 + 1, min(w, int(x + bw))), max(y0 + 1, min(h, int(y + bh)))
        return ToyJob(
            **frame_fields(frame),
            image=np.ascontiguousarray(frame.image[y0:y1, x0:x1]),
            track_id=target.track_id,
            group=target.group,
        )

    def prepare_one(self, job: ToyJob) -> np.ndarray:
        return toy_input(job.image)

    def dummy_input(self) -> np.ndarray:
        return np.zeros((3, 8, 8), np.float32)

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        return [self.model.apply(x) for x in inputs]
