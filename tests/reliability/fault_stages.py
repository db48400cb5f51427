"""Helper stages for the reliability tests' configs (`kind = "fault_stages:FaceJobs"`):
a stand-in for detect + align that turns each frame into one face job, one that turns each
frame into a pose, a face and a CLIP job, and a sink that keeps every item with the wall
time it arrived."""

from __future__ import annotations

import os

import cv2
import numpy as np

from pipeline.graph import MapStage, Stage, StageOptions
from pipeline.messages import Frame, now_ns
from stages.jobs import ClipJob, FaceJob, PoseJob


class FaceJobs(MapStage):
    """Frame -> one FaceJob whose aligned face is the frame resized to 112x112 (uint8 BGR)."""

    kind = "face_jobs"
    accepts = (Frame,)

    def process(self, item: Frame):
        h, w = item.image.shape[:2]
        return [
            FaceJob(
                camera=item.camera,
                seq=item.seq,
                capture_ts_ns=item.capture_ts_ns,
                deadline_ns=item.deadline_ns,
                frame_size=(w, h),
                box_xywh=np.array([0, 0, w, h], np.float32),
                score=1.0,
                landmarks=np.zeros((5, 2), np.float32),
                aligned=cv2.resize(item.image, (112, 112), interpolation=cv2.INTER_AREA),
            )
        ]


class ModelJobsOptions(StageOptions):
    active_file: str | None = None  # jobs only while this file exists (None: always)


class ModelJobs(FaceJobs):
    """Frame -> a PoseJob and a ClipJob over the whole frame, and FaceJobs' face job; none
    while `active_file` is missing (a test switches the models' load off and on)."""

    kind = "model_jobs"
    Options = ModelJobsOptions

    def process(self, item: Frame):
        flag = self.options.active_file
        if flag is not None and not os.path.exists(flag):
            return []
        h, w = item.image.shape[:2]
        ids = dict(
            camera=item.camera, seq=item.seq, capture_ts_ns=item.capture_ts_ns,
            deadline_ns=item.deadline_ns, frame_size=(w, h),
        )  # fmt: skip
        box = np.array([0, 0, w, h], np.float32)
        return [
            PoseJob(**ids, track_id=item.seq % 2, box_xywh=box, score=1.0, image=item.image),
            ClipJob(**ids, box_xywh=box, image=item.image),
            *super().process(item),
        ]


class Timed(Stage):
    """Keeps (arrival wall time ns, item) of everything it receives."""

    kind = "timed"
    accepts = (object,)

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.items: list[tuple[int, object]] = []

    async def run(self, inbox, out) -> None:
        async for item in inbox:
            self.items.append((now_ns(), item))
