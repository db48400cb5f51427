"""Helper stages for the reliability tests' configs (`kind = "fault_stages:FaceJobs"`):
a stand-in for detect + align that turns each frame into one face job, and a sink that keeps
every item with the wall time it arrived."""

from __future__ import annotations

import cv2
import numpy as np

from pipeline.graph import MapStage, Stage
from pipeline.messages import Frame, now_ns
from stages.jobs import FaceJob


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
