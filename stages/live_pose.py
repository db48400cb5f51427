"""The detect stage's per-frame whole-body pose of one camera (docs/live-pose.md): MediaPipe's
landmark models follow each person on every frame (stages.landmarks.tracker, the detector run
only when tracking needs it), each person's keypoints on Sapiens2's 308 (schema.to_308) with
that track's real-weight Sapiens2 keyframes fused in (fusion.KeyframeFusion)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field

from npu.models.sapiens2.keypoints import NAMES as KEYPOINT_NAMES
from pipeline.graph import StageOptions
from pipeline.messages import Frame, now_ns
from stages.detectors.detections import DetectorOutput
from stages.landmarks.fusion import Fused, KeyframeFusion
from stages.landmarks.parts import anchor_points, sapiens308_parts
from stages.landmarks.result import LivePoseResult
from stages.landmarks.schema import to_308
from stages.landmarks.tracker import LandmarkTracker, PersonDetector, PersonLandmarks
from stages.tracks import Keyframe

LIVE_MODEL = "mediapipe-landmarks"  # the `model` of a per-frame pose message
MAX_LIVE_PEOPLE = 16


class LiveOptions(StageOptions):
    """detect's `live` table (docs/configuration.md): the per-frame pose and its costs."""

    enabled: bool = False
    # the landmark models run per person-frame: body 33 points (feet included), + both hands
    # 21 each, + the 468-point face mesh (which only moves keyframe face points)
    parts: list[Literal["body", "hands", "face"]] = ["body", "hands"]
    max_people: int = Field(2, ge=1, le=MAX_LIVE_PEOPLE)  # people followed per camera
    detect_every: int = Field(10, ge=1)  # frames between detector runs while fewer are followed
    # what seeds a landmark track: "blazepose", BlazePose's detector on the whole frame (one
    # pass); "blazepose-tiles", on the whole frame and on square tiles along its long side
    # (1 + 3 passes on a portrait 1088x1920 view), which finds people it misses at whole-frame
    # scale (stages/landmarks/tiles.py; docs/live-pose.md, "Seeding detector")
    seed_detector: Literal["blazepose", "blazepose-tiles"] = "blazepose"
    detector_min_score: float = Field(0.5, ge=0, le=1)
    box_margin: float = Field(0.1, ge=0, le=1)  # person box: landmarks' extent + this a side
    offset_half_life_s: float = Field(1.0, gt=0)  # a keyframe's correction of a CPU point
    score_half_life_s: float = Field(2.0, gt=0)  # a keyframe-only point's confidence
    history_s: float = Field(10.0, gt=0)  # a keyframe older than this is not fused (counted)


@dataclass
class LivePerson:
    """One person the landmark models follow this frame: box float32 [4] xywh in pixels (the
    extent of the body landmarks inside the frame, grown by box_margin) and the pose flag."""

    landmarks: PersonLandmarks
    box_xywh: np.ndarray
    score: float


class _TimedDetector:
    """The person detector, its thread CPU time counted apart from the landmark models'."""

    def __init__(self, detector: PersonDetector) -> None:
        self.detector = detector
        self.cpu_s = 0.0

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        c0 = time.thread_time()
        try:
            return self.detector.detect(image, colour_order)
        finally:
            self.cpu_s += time.thread_time() - c0


def _box(xy: np.ndarray, size: tuple[int, int], margin: float) -> np.ndarray:
    w, h = size
    lo = np.clip(xy.min(axis=0), 0, [w, h])
    hi = np.clip(xy.max(axis=0), 0, [w, h])
    pad = (hi - lo) * margin
    lo = np.clip(lo - pad, 0, [w, h])
    hi = np.clip(hi + pad, 0, [w, h])
    return np.array([lo[0], lo[1], hi[0] - lo[0], hi[1] - lo[1]], np.float32)


class CameraLive:
    """One camera's landmark tracker and per-track fusion. `people(frame)` runs the landmark
    models; `results(frame, people, track_ids, keyframes)` fuses the keyframes that arrived and
    returns a LivePoseResult for each person the detect stage's tracker tracks. Counters:
    keyframes_fused, keyframes_unmatched (its track or frame no longer followed); cpu_s (the
    thread's CPU time in both calls, the person detector's included), detector_cpu_s and
    person_frames, which `npucam plan` prices from."""

    def __init__(self, camera: str, options: LiveOptions, detector: PersonDetector) -> None:
        self.camera = camera
        self.options = options
        self._detector = _TimedDetector(detector)
        self.tracker = LandmarkTracker(
            self._detector,
            parts=options.parts,
            max_people=options.max_people,
            detect_every=options.detect_every,
        )
        self._fusions: dict[int, KeyframeFusion] = {}  # by landmark track id
        # per processed frame: (capture time, seq, detect track id -> landmark track id)
        self._frames: deque[tuple[int, int, dict[int, int]]] = deque()
        self._keyframe_seq: dict[int, int] = {}  # landmark track id -> seq of its keyframe
        self._last_ts: int | None = None
        self._previous_ts: dict[int, int] = {}  # detect track id -> its previous live pose
        self.keyframes_fused = 0
        self.keyframes_unmatched = 0
        self.cpu_s = 0.0
        self.person_frames = 0

    @property
    def detector_cpu_s(self) -> float:
        return self._detector.cpu_s

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Adds the thread's CPU time inside to cpu_s."""
        c0 = time.thread_time()
        try:
            yield
        finally:
            self.cpu_s += time.thread_time() - c0

    def people(self, frame: Frame) -> list[LivePerson]:
        with self._timed():
            if self._last_ts is not None and frame.capture_ts_ns <= self._last_ts:
                self._reset()  # the clock went back: nothing fused across the jump
            self._last_ts = frame.capture_ts_ns
            h, w = frame.image.shape[:2]
            found = self.tracker.step(frame.image, frame.capture_ts_ns / 1e9)
            margin = self.options.box_margin
            return [
                LivePerson(p, _box(p.body.xy, (w, h), margin), float(p.body.flag)) for p in found
            ]

    def _reset(self) -> None:
        self._fusions.clear()
        self._frames.clear()
        self._keyframe_seq.clear()
        self._previous_ts.clear()

    def _fusion(self, landmark_id: int) -> KeyframeFusion:
        fusion = self._fusions.get(landmark_id)
        if fusion is None:
            o = self.options
            fusion = self._fusions[landmark_id] = KeyframeFusion(
                len(KEYPOINT_NAMES),
                sapiens308_parts(),
                offset_half_life_s=o.offset_half_life_s,
                score_half_life_s=o.score_half_life_s,
                history_s=o.history_s,
            )
        return fusion

    def _fuse_keyframes(self, keyframes: list[Keyframe]) -> None:
        for kf in keyframes:
            at = next((m for ts, seq, m in self._frames if ts == kf.capture_ts_ns), None)
            landmark_id = None if at is None else at.get(kf.track_id)
            fusion = None if landmark_id is None else self._fusions.get(landmark_id)
            if fusion is None or kf.keypoints.shape != (len(KEYPOINT_NAMES), 3):
                self.keyframes_unmatched += 1
                continue
            try:
                fusion.keyframe(kf.capture_ts_ns / 1e9, kf.keypoints[:, :2], kf.keypoints[:, 2])
            except ValueError:  # its frame left the fusion's history
                self.keyframes_unmatched += 1
                continue
            assert landmark_id is not None
            self._keyframe_seq[landmark_id] = kf.seq
            self.keyframes_fused += 1

    def results(
        self,
        frame: Frame,
        people: list[LivePerson],
        track_ids: list[int | None],
        keyframes: list[Keyframe],
    ) -> list[LivePoseResult]:
        """One LivePoseResult per person with a detect track id (track_ids[i] is people[i]'s),
        after fusing `keyframes` (Sapiens2 poses of earlier frames, by detect track id) into
        their landmark tracks."""
        self.person_frames += len(people)
        with self._timed():
            return self._results(frame, people, track_ids, keyframes)

    def _results(
        self, frame: Frame, people: list[LivePerson], track_ids: list, keyframes: list[Keyframe]
    ) -> list[LivePoseResult]:
        ts = frame.capture_ts_ns
        mapping = {
            tid: p.landmarks.track_id
            for p, tid in zip(people, track_ids, strict=True)
            if tid is not None
        }
        self._frames.append((ts, frame.seq, mapping))
        horizon = ts - round(self.options.history_s * 1e9)
        while self._frames and self._frames[0][0] < horizon:
            self._frames.popleft()
        self._fuse_keyframes(keyframes)  # their frames are earlier ones, in the history
        fused: list[tuple[LivePerson, int, Fused]] = []
        for person, tid in zip(people, track_ids, strict=True):
            lm = person.landmarks
            xy, score = to_308(
                lm.body.xy,
                lm.body.visibility,
                {s: (h.xy, h.flag) if h is not None else None for s, h in lm.hands.items()},
            )
            hands = {s: (h.xy if h is not None else None) for s, h in lm.hands.items()}
            face = lm.face.xy if lm.face is not None else None
            anchors = anchor_points(lm.body.xy, hands.get("left"), hands.get("right"), face)
            out = self._fusion(lm.track_id).frame(ts / 1e9, xy, score, anchors)
            if tid is not None:
                fused.append((person, tid, out))
        live = {p.landmarks.track_id for p in people}
        for gone in set(self._fusions) - live:
            del self._fusions[gone]
            self._keyframe_seq.pop(gone, None)
        at = now_ns()
        results = []
        for person, tid, out in fused:
            previous = self._previous_ts.get(tid)
            self._previous_ts[tid] = ts
            keypoints = np.concatenate(
                [np.nan_to_num(out.xy, nan=0.0), out.score[:, None]], axis=1
            ).astype(np.float32)
            results.append(
                LivePoseResult(
                    camera=frame.camera,
                    seq=frame.seq,
                    capture_ts_ns=ts,
                    deadline_ns=frame.deadline_ns,
                    backend="cpu",
                    model=LIVE_MODEL,
                    track_id=tid,
                    keypoints=keypoints,
                    box=np.array(
                        [*person.box_xywh[:2], *(person.box_xywh[:2] + person.box_xywh[2:])],
                        np.float32,
                    ),
                    score=person.score,
                    age_ms=(at - ts) / 1e6,
                    since_previous_ms=None if previous is None else (ts - previous) / 1e6,
                    parts=tuple(self.options.parts),
                    keyframe_seq=self._keyframe_seq.get(person.landmarks.track_id),
                    source=out.source,
                    keyframe_age_ms=(out.age * 1e3).astype(np.float32),
                )
            )
        for gone in set(self._previous_ts) - {tid for _, tid, _ in fused}:
            del self._previous_ts[gone]
        return results
