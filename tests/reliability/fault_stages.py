"""Helper stages for the reliability tests' configs (`kind = "fault_stages:FaceJobs"`):
a stand-in for detect + align that turns each frame into one face job, one that turns each
frame into a pose, a face and a CLIP job, a sink that keeps every item with the wall time it
arrived, and a sink that reports its process's malloc arenas."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import tempfile
import threading
from pathlib import Path

import cv2
import numpy as np
from pydantic import Field

from pipeline.graph import MapStage, Stage, StageOptions
from pipeline.messages import Frame, now_ns
from stages.models.adaface.job import FaceJob
from stages.models.clip.job import ClipJob
from stages.models.sapiens2.job import PoseJob


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


class TrackedJobs(FaceJobs):
    """Frame -> FaceJobs' face job and a ClipJob over the whole frame, both of track 1: as
    detect sends them for one person seen in every frame."""

    kind = "tracked_jobs"

    def process(self, item: Frame):
        (face,) = super().process(item)
        face.track_id = 1
        h, w = item.image.shape[:2]
        clip = ClipJob(
            camera=item.camera, seq=item.seq, capture_ts_ns=item.capture_ts_ns,
            deadline_ns=item.deadline_ns, frame_size=(w, h),
            box_xywh=np.array([0, 0, w, h], np.float32), image=item.image, track_id=1,
        )  # fmt: skip
        return [face, clip]


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


class ArenasOptions(StageOptions):
    report: str = Field(min_length=1)  # where the arena count is written at the end


def malloc_arenas() -> int:
    """glibc's arenas in this process, from malloc_info(3)'s XML (one <heap nr=...> each)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
    libc.fclose.argtypes = (ctypes.c_void_p,)
    libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
    with tempfile.NamedTemporaryFile(suffix=".xml") as tmp:
        f = libc.fopen(tmp.name.encode(), b"w")
        libc.malloc_info(0, f)
        libc.fclose(f)
        return len(re.findall(r"<heap nr=", Path(tmp.name).read_text()))


class Arenas(Stage):
    """Copies each frame in a worker thread, so the executor's threads allocate frame-sized
    buffers; when its inbox ends it writes {"arenas": malloc_arenas(), "threads": names of
    the process's threads} to `report` as JSON."""

    kind = "arenas"
    accepts = (Frame,)
    Options = ArenasOptions

    async def run(self, inbox, out) -> None:
        async for item in inbox:
            await asyncio.to_thread(lambda image=item.image: image.astype(np.float32).sum())
        threads = sorted(t.name for t in threading.enumerate())
        Path(self.options.report).write_text(
            json.dumps({"arenas": malloc_arenas(), "threads": threads})
        )
