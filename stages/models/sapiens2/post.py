"""The dark stage: Sapiens2's pose heatmaps -> 308 keypoints in frame pixels
(npu.models.sapiens2.post), published as PoseResults; with face_points, a FaceJob per pose's
face."""

from __future__ import annotations

import numpy as np
from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from npu.models.sapiens2.keypoints import NAMES as KEYPOINT_NAMES
from npu.models.sapiens2.keypoints import face_points
from npu.models.sapiens2.post import BLUR_KERNEL, dark_keypoints
from pipeline.graph import MapStage, StageOptions
from pipeline.messages import now_ns
from stages.jobs import Inferred
from stages.models.adaface.job import FaceJob
from stages.models.sapiens2.job import PoseInferred, PoseJob
from stages.models.sapiens2.result import PoseResult
from stages.postprocess import PostprocessError, result_fields, xyxy
from stages.tracks import Keyframe, TrackRegistry

MAX_BLUR_KERNEL = 99  # DARK's blur kernel: the heatmaps are 64 x 48 (Sapiens2: 256 x 192)


class DarkOptions(StageOptions):
    kernel: int = Field(BLUR_KERNEL, ge=3, le=MAX_BLUR_KERNEL)  # DARK's Gaussian blur (odd)
    # face jobs from each 308-keypoint pose's 5 face points (npu.models.sapiens2.keypoints), sent
    # on by the detect stage of the same run with its next frame of that camera
    face_points: bool = False
    face_min_score: float = Field(0.3, ge=0)  # every point used must score above this

    @field_validator("kernel")
    @classmethod
    def _odd(cls, kernel: int) -> int:
        if kernel % 2 == 0:  # npu.models.sapiens2.post.gaussian_taps refuses it on every pose
            raise PydanticCustomError("odd_kernel", "expected an odd integer")
        return kernel


class Dark(MapStage[DarkOptions]):
    """Inferred pose heatmaps -> PoseResult: DARK keypoints in frame pixels through the crop
    window the infer stage recorded, with the track id and the pose's age (the track's pose
    refresh is marked finished in the run's tracker, stages.tracks.TrackRegistry, and a
    real-weight pose is handed to detect's live pose there as a keyframe)."""

    kind = "dark"
    accepts = (PoseInferred,)
    Options = DarkOptions

    @classmethod
    def produces(cls, options: DarkOptions) -> tuple[type, ...]:
        """With face_points, a FaceJob per pose's face (sent on by the detect stage)."""
        return (FaceJob,) if options.face_points else ()

    def process(self, item: Inferred) -> list[PoseResult]:
        job = item.job
        if not isinstance(job, PoseJob):
            return []
        where = f"camera {job.camera!r} #{job.seq} track {job.track_id}"
        if job.window is None:
            raise PostprocessError(f"{where}: the pose job has no crop window from infer")
        heatmaps = np.asarray(item.output)
        if heatmaps.ndim != 3:
            raise PostprocessError(f"{where}: heatmaps must be [K, H, W], got {heatmaps.shape}")
        keypoints = dark_keypoints(
            heatmaps[None].astype(np.float32, copy=False),
            np.asarray(job.window, np.float32).reshape(1, 4),
            self.options.kernel,
        )[0]
        at = now_ns()
        tag = None
        tracks = TrackRegistry.of(self.context).get(job.camera)
        if tracks is not None:
            tag = tracks.finish_pose(job.track_id, job.capture_ts_ns, at)
            face = self._face_job(job, keypoints) if self.options.face_points else None
            with tracks.lock:
                if face is not None:
                    tracks.pose_faces.append(face)
                if not item.synthetic:  # synthetic weights are never fused into real keypoints
                    tracks.keyframes.append(
                        Keyframe(job.track_id, job.seq, job.capture_ts_ns, keypoints)
                    )
        if tag is not None and tag.tracked:  # the tracker's word: since its previous pose
            since_ms = None if tag.since_previous_ns is None else tag.since_previous_ns / 1e6
        else:  # no tracker in this run (a split config), or the track expired while its
            # pose ran (the tracker forgot it): the age detect saw when it made the job
            since_ms = None if job.pose_age_s is None else job.pose_age_s * 1e3
        return [
            PoseResult(
                **result_fields(item),
                track_id=job.track_id,
                keypoints=keypoints,
                box=xyxy(job.box_xywh),
                score=job.score,
                age_ms=(at - job.capture_ts_ns) / 1e6,
                since_previous_ms=since_ms,
            )
        ]

    def _face_job(self, job: PoseJob, keypoints: np.ndarray) -> FaceJob | None:
        """A face job on the pose's own frame from its 5 face points, or None when the pose
        is not Sapiens2's 308 keypoints or a point has no confident candidate. The box is
        an approximation: a square of twice the points' extent around their mean."""
        if keypoints.shape[0] != len(KEYPOINT_NAMES) or job.image is None:
            return None
        points = face_points(keypoints, self.options.face_min_score)
        if points is None:
            return None
        centre = points.mean(axis=0)
        side = 2.0 * float(np.ptp(points, axis=0).max())
        if side <= 0:
            return None
        return FaceJob(
            camera=job.camera,
            seq=job.seq,
            capture_ts_ns=job.capture_ts_ns,
            deadline_ns=job.deadline_ns,
            frame_size=job.frame_size,
            box_xywh=np.array([*(centre - side / 2), side, side], np.float32),
            score=job.score,
            landmarks=points,
            image=job.image,
            track_id=job.track_id,
            landmark_source="sapiens2",
        )
