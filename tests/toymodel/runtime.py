"""The toy's runtime: a ToyJob's frame, averaged on a 3 x 8 x 8 grid (RGB in [0, 1]), through
the model; ToyInferred goes on to the toy's postprocess stage (tests.toymodel.stages)."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from stages.jobs import Inferred, Job
from stages.runtimes import Runtime


@dataclass(slots=True, kw_only=True)
class ToyJob(Job):
    """A whole frame to run the toy on. image: uint8 BGR [H, W, 3]."""

    image: np.ndarray


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

    def prepare_one(self, job: ToyJob) -> np.ndarray:
        return toy_input(job.image)

    def dummy_input(self) -> np.ndarray:
        return np.zeros((3, 8, 8), np.float32)

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        return [self.model.apply(x) for x in inputs]
