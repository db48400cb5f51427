"""AdaFace in the infer stage: a FaceJob's aligned crop in the model's colour order
(npu.models.adaface.preprocess) -> the un-normalised embedding float32 [512]."""

from __future__ import annotations

import numpy as np

from npu.models.adaface.preprocess import embedder_input
from pipeline.messages import Frame
from stages.job_policy import Target
from stages.jobs import frame_fields
from stages.models.adaface.job import FaceInferred, FaceJob
from stages.runtimes import JobInputError, ModelOptions, Runtime


class AdaFaceRuntime(Runtime[ModelOptions, FaceJob]):
    """AdaFace: FaceJob (aligned BGR crop) -> the un-normalised embedding float32 [512]."""

    job_type = FaceJob
    inferred_type = FaceInferred

    @classmethod
    def make_job(cls, target: Target, frame: Frame) -> FaceJob:
        """A face with its alignment points, on its frame (the align stage crops it)."""
        assert target.box_xywh is not None and target.landmarks is not None
        return FaceJob(
            **frame_fields(frame),
            box_xywh=target.box_xywh,
            score=target.score,
            landmarks=target.landmarks,
            image=frame.image,
            track_id=target.track_id,
            landmark_source=target.landmark_source,
        )

    def schedule_key(self, job: FaceJob) -> tuple | None:
        """Per tracked person and landmark source: a detector face and a pose-derived face of
        one track both run."""
        key = super().schedule_key(job)
        return None if key is None else (*key, job.landmark_source)

    def prepare_one(self, job: FaceJob) -> np.ndarray:
        if job.aligned is None:
            raise JobInputError(
                f"camera {job.camera!r} #{job.seq}: face job was not aligned (run align first)"
            )
        return embedder_input(job.aligned, "bgr", self.model.colour_order())

    def dummy_input(self) -> np.ndarray:
        return np.zeros((3, 112, 112), np.float32)

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(self.model.embed(x), np.float32) for x in inputs]
