"""Work items between the detect, align, infer and postprocess stages: the fields every job
shares (Job), the base of jobs on faces with alignment points (LandmarkJob) and the infer
stage's output (Inferred); each model's own job and Inferred types are in its package
(stages/models/<model>/job.py).

Each job carries its frame's identity (camera, seq, capture time, deadline) so every result
can be published with the frame it came from and dropped once stale; `box_xywh` is always
in frame pixels. Pose and CLIP jobs hold a reference to the frame, not a crop: the model's
host glue in the infer stage crops at the model's own input size (crop_persons,
clip.preprocess), overlapped with the device run of the previous batch, so a queued job
costs a frame reference instead of a 9 MB float crop.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.messages import Frame, now_ns


@dataclass(slots=True, kw_only=True)
class Job:
    """Fields every job shares: the source frame's identity and staleness deadline."""

    camera: str
    seq: int
    capture_ts_ns: int
    deadline_ns: int
    frame_size: tuple[int, int] = (0, 0)  # (width, height) of the source frame
    # jobs the scheduler runs together, one shared priority (a rig's views of one instant:
    # stages.rig.groups.RigTag); None for a job of its own
    group: Hashable | None = None

    def expired(self, at_ns: int | None = None) -> bool:
        """True once the job is past its camera's staleness budget."""
        return (now_ns() if at_ns is None else at_ns) > self.deadline_ns


def frame_fields(frame: Frame) -> dict[str, Any]:
    """The Job fields of a frame's jobs: its identity, deadline and (width, height)."""
    h, w = frame.image.shape[:2]
    return {
        "camera": frame.camera,
        "seq": frame.seq,
        "capture_ts_ns": frame.capture_ts_ns,
        "deadline_ns": frame.deadline_ns,
        "frame_size": (int(w), int(h)),
    }


@dataclass(slots=True, kw_only=True)
class LandmarkJob(Job):
    """A job on a face with alignment points (detect -> align -> infer): the align stage
    aligns every job of this type and passes any other through.

    image: the source frame, uint8 BGR [H, W, 3] (dropped once aligned); landmarks: float32
    [5, 2] in template order, or BlazeFace's [4, 2] (stages.align); aligned: uint8
    [size, size, 3] BGR once aligned.
    """

    box_xywh: np.ndarray
    score: float
    landmarks: np.ndarray
    image: np.ndarray | None = None
    aligned: np.ndarray | None = None
    track_id: int | None = None
    landmark_source: str = ""


@dataclass(slots=True, kw_only=True)
class Inferred:
    """A model's raw output for one job (infer -> postprocess): `output` is heatmaps float32
    [K, h, w] for pose, an embedding float32 [D] for faces and CLIP images. For CLIP, extra
    holds "labels" (list[str]), "text_embeds" float32 [L, D] and "logit_scale" (float), so
    postprocess computes label probabilities without the model."""

    job: Job
    output: np.ndarray
    backend: str
    model: str
    synthetic: bool
    device_s: float = 0.0
    extra: dict = field(default_factory=dict)

    # The job's frame identity, read the way pipeline.queues reads every item (camera,
    # deadline_ns), so inboxes expire and account outputs like any other message.
    @property
    def camera(self) -> str:
        return self.job.camera

    @property
    def seq(self) -> int:
        return self.job.seq

    @property
    def capture_ts_ns(self) -> int:
        return self.job.capture_ts_ns

    @property
    def deadline_ns(self) -> int:
        return self.job.deadline_ns

    def expired(self, at_ns: int | None = None) -> bool:
        """True once the job is past its camera's staleness budget."""
        return self.job.expired(at_ns)
