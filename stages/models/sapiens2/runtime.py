"""Sapiens2-Pose in the infer stage: a PoseJob's frame cropped at the model's input size
(npu.models.sapiens2.preprocess) -> heatmaps float32 [K, h, w] and the crop window. A track's
refresh takes the newest frame detect tracked it on when its pass is dispatched, not the frame
it was queued with (stages.tracks.CameraTracks.newest)."""

from __future__ import annotations

from typing import Any

import numpy as np

from npu.device import Steps
from npu.host_memory import faulted
from npu.models.sapiens2.preprocess import crop_persons
from pipeline.messages import Frame
from stages.job_policy import Target
from stages.jobs import frame_fields
from stages.models.sapiens2.job import PoseInferred, PoseJob
from stages.runtimes import JobInputError, ModelOptions, PacedTimer, Runtime, SlotOutput
from stages.tracks import TrackRegistry


class Sapiens2Runtime(Runtime[ModelOptions, PoseJob]):
    """Sapiens2-Pose: PoseJob -> heatmaps float32 [K, h, w] and the crop window."""

    job_type = PoseJob
    inferred_type = PoseInferred
    tracks: TrackRegistry | None = None

    def attach(self, context: Any) -> None:
        self.tracks = TrackRegistry.of(context)

    def freshen(self, job: PoseJob) -> None:
        """Move a track's refresh to the newest frame detect tracked it on, if newer than its
        own (not a rig group's job: the group is posed on its own frames)."""
        cam = None if self.tracks is None or job.group is not None else self.tracks.get(job.camera)
        newest = None if cam is None else cam.newest_frame(job.track_id)
        if newest is None or newest.capture_ts_ns <= job.capture_ts_ns:
            return
        if job.pose_age_s is not None:
            job.pose_age_s += (newest.capture_ts_ns - job.capture_ts_ns) / 1e9
        job.seq, job.capture_ts_ns, job.deadline_ns = (
            newest.seq,
            newest.capture_ts_ns,
            newest.deadline_ns,
        )
        job.image, job.box_xywh = newest.image, newest.box_xywh

    @classmethod
    def make_job(cls, target: Target, frame: Frame) -> PoseJob:
        """A tracked person's pose refresh: its box, its track's score, and how old its
        last pose is (None: never posed)."""
        assert target.track_id is not None and target.box_xywh is not None
        since = target.since_ns
        return PoseJob(
            **frame_fields(frame),
            track_id=target.track_id,
            box_xywh=target.box_xywh,
            score=target.score,
            image=frame.image,
            pose_age_s=None if since is None else (frame.capture_ts_ns - since) / 1e9,
            group=target.group,
        )

    def priority(self, job: PoseJob) -> int:
        """The oldest pose first: never-posed tracks, then by when the last pose was taken."""
        if job.pose_age_s is None:
            return -1
        return job.capture_ts_ns - round(job.pose_age_s * 1e9)

    def prepare_one(self, job: PoseJob) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.model.config
        self.freshen(job)  # the prepare thread runs it as the pass is dispatched
        if job.image is None:
            raise JobInputError(f"camera {job.camera!r} #{job.seq}: pose job without a frame")
        rgb = np.ascontiguousarray(job.image[..., ::-1])
        crops, windows = crop_persons(
            rgb,
            np.asarray(job.box_xywh, np.float32).reshape(1, 4),
            output_size=(cfg.H, cfg.W),
            mean=cfg.mean,
            std=cfg.std,
            padding=cfg.box_pad,
        )
        return crops[0], windows[0]

    def dummy_input(self) -> np.ndarray:
        cfg = self.model.config
        return np.zeros((3, cfg.H, cfg.W), np.float32)

    def forward(self, inputs: np.ndarray) -> list[np.ndarray]:
        return list(self.model.heatmaps(np.ascontiguousarray(inputs, np.float32)))

    @property
    def stepped(self) -> bool:
        """A bundle replay (sim, npu) runs as steps; the cpu forward does not, nor a pass
        paced as NPU2 (one modelled wait from the pass's start: PacedTimer)."""
        return hasattr(self.model.ops, "heatmap_steps") and not isinstance(self.timer, PacedTimer)

    def output_rows(self) -> np.ndarray | None:
        """A stepped pass's heatmaps, faulted in on the prepare thread: float32
        [batch, K, Hh, Wh] (Config.heatmap_size; 60 MB a box at 0.4b; a fresh array's first
        touch stalled the device thread 100-180 ms a box in huge-page compaction)."""
        if not self.stepped:
            return None
        cfg = self.model.config
        return faulted((self.batch_size, cfg.K, *cfg.heatmap_size))

    def forward_steps(self, inputs: np.ndarray, outputs: np.ndarray | None = None) -> Steps:
        outs = []
        for i, crop in enumerate(np.ascontiguousarray(inputs, np.float32)):
            out = None if outputs is None else outputs[i]
            outs.append((yield from self.model.ops.heatmap_steps(crop, out=out)))
        return outs

    def finish(self, job: PoseJob, slot: SlotOutput) -> None:
        job.window = slot.aux
