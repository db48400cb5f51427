"""The per-camera person trackers of one pipeline run, shared by its detect stage (which
submits pose jobs) and its dark stage (which finishes them and feeds pose-derived faces and
real-weight keyframes back): one TrackRegistry per run, owned by the pipeline's Context
(Context.shared)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from stages.models.adaface.job import FaceJob
from stages.tracker import PersonTracker, PoseTag

POSE_FACES_KEPT = 8  # face jobs from pose keypoints waiting for detect's next frame
NEWEST_KEPT_NS = 10 * 1_000_000_000  # a track's newest frame, kept while it may come back
KEYFRAMES_KEPT = 32  # Sapiens2 poses waiting for detect's next frame (the live pose's keyframes)


@dataclass(frozen=True)
class Keyframe:
    """A real-weight Sapiens2 pose of one track, for the live pose's fusion: keypoints float32
    [K, 3] (x, y, score) in frame pixels, on the frame (seq, capture_ts_ns) it was computed on."""

    track_id: int
    seq: int
    capture_ts_ns: int
    keypoints: np.ndarray


@dataclass(frozen=True)
class NewestFrame:
    """The newest frame detect tracked a person on: its identity, image (uint8 BGR) and the
    track's box there (float32 [4] xywh); a pose job takes it when the device is about to run
    (stages.models.sapiens2.runtime)."""

    seq: int
    capture_ts_ns: int
    deadline_ns: int
    image: np.ndarray
    box_xywh: np.ndarray


class CameraTracks:
    """One camera's tracker and its outstanding pose jobs, shared by detect (which submits
    them) and the dark stage (which finishes them); every access holds `lock`."""

    def __init__(self, tracker: PersonTracker) -> None:
        self.tracker = tracker
        self.lock = threading.Lock()
        # track id -> when its pose job counts as lost (its deadline, or the retry time)
        self.pose_deadlines: dict[int, int] = {}
        # face jobs built from Sapiens2 face keypoints (the dark stage's face_points), sent
        # on by detect with its next frame of this camera; the newest POSE_FACES_KEPT
        self.pose_faces: deque[FaceJob] = deque(maxlen=POSE_FACES_KEPT)
        # real-weight Sapiens2 poses for detect's live pose (never a synthetic model's), taken
        # by detect with its next frame of this camera; the newest KEYFRAMES_KEPT
        self.keyframes: deque[Keyframe] = deque(maxlen=KEYFRAMES_KEPT)
        # track id -> the newest frame it was tracked on (kept NEWEST_KEPT_NS after that)
        self.newest: dict[int, NewestFrame] = {}

    def tracked_on(self, newest: dict[int, NewestFrame]) -> None:
        """Record the tracks of detect's latest frame (call holding `lock`); entries of
        tracks not seen for NEWEST_KEPT_NS go."""
        self.newest.update(newest)
        if newest:
            horizon = max(f.capture_ts_ns for f in newest.values()) - NEWEST_KEPT_NS
            for tid in [t for t, f in self.newest.items() if f.capture_ts_ns < horizon]:
                del self.newest[tid]

    def newest_frame(self, track_id: int) -> NewestFrame | None:
        with self.lock:
            return self.newest.get(track_id)

    def expire_poses(self, at_ns: int) -> None:
        """Free the tracks whose pose job is past its deadline (or retry time) unanswered."""
        for track_id, deadline in list(self.pose_deadlines.items()):
            if at_ns > deadline:
                del self.pose_deadlines[track_id]
                self.tracker.pose_finished(track_id, None, at_ns)

    def clock_jumped(self, delta_ns: int) -> None:
        """The frame clock moved by delta_ns (the tracker saw a jump): the outstanding pose
        jobs' deadlines move with it, so none waits out the jump before it is retried."""
        for track_id in self.pose_deadlines:
            self.pose_deadlines[track_id] += delta_ns

    def finish_pose(self, track_id: int, capture_ts_ns: int, at_ns: int) -> PoseTag | None:
        with self.lock:
            self.pose_deadlines.pop(track_id, None)
            return self.tracker.pose_finished(track_id, capture_ts_ns, at_ns)


class TrackRegistry:
    """One run's CameraTracks by camera: the explicit object through which the dark stage
    finishes the pose jobs detect submitted and hands detect the face jobs it built from
    Sapiens2's face keypoints (docs/architecture.md). Get it with TrackRegistry.of(context):
    the pipeline's Context owns one per run."""

    def __init__(self) -> None:
        self._cameras: dict[str, CameraTracks] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, context: Any) -> TrackRegistry:
        """The registry of the run `context` belongs to."""
        return context.shared("stages.tracks", cls)

    def get(self, camera: str) -> CameraTracks | None:
        """The camera's tracks, None if no detect stage has tracked it."""
        return self._cameras.get(camera)

    def add(self, camera: str, tracker: PersonTracker) -> CameraTracks:
        """The camera's tracks, made with `tracker` if it has none yet."""
        with self._lock:
            return self._cameras.setdefault(camera, CameraTracks(tracker))
