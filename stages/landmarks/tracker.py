"""People followed on one camera by the CPU landmark models, the detector run only when tracking
needs it (MediaPipe's pose_landmark_cpu.pbtxt loop, for up to max_people people).

Each frame: every live track runs the body model in the ROI its previous frame gave; a track
whose pose flag drops is removed. The person detector runs when no one is tracked, and every
`detect_every` frames while fewer than max_people are; a detection whose ROI centre (the hip
centre) lies within 0.2 ROI sides of a live track's (`same_person`) is that person again and is
ignored. With max_people = 1 this is MediaPipe Pose's own schedule (detect only while nobody is
tracked).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from stages.detectors.detections import DetectorError, DetectorOutput
from stages.landmarks.body import BodyLandmarker, BodyLandmarks, BodyTrack, roi_from_detection
from stages.landmarks.face import FaceLandmarker, FaceLandmarks, FaceTrack
from stages.landmarks.hands import HandLandmarker, HandLandmarks, HandTrack
from stages.landmarks.rects import Rect

PARTS = ("body", "hands", "face")
# A pose ROI is 2.5 body radii a side around the hip centre (roi_from_detection), so 0.2 sides
# is half a radius: ~40 cm on an adult. Duplicate detections of one person land within 0.1
# sides on Pose2Sim's multi-person demo, two people side by side 0.35-0.4 apart; the boxes'
# IoU, which an earlier rule used, is over 0.3 for such neighbours and merged them.
SAME_PERSON_CENTRE = 0.2


def same_person(a: Rect, b: Rect) -> bool:
    """Whether two pose ROIs are one person: centres within SAME_PERSON_CENTRE of the larger
    side."""
    side = max(a.w, a.h, b.w, b.h)
    return float(np.hypot(a.cx - b.cx, a.cy - b.cy)) < SAME_PERSON_CENTRE * side


class PersonDetector(Protocol):
    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput: ...


@dataclass
class PersonLandmarks:
    """One tracked person this frame (image pixels); hands and face None when not run or not
    found."""

    track_id: int
    body: BodyLandmarks
    hands: dict[str, HandLandmarks | None] = field(default_factory=dict)
    face: FaceLandmarks | None = None


@dataclass
class _Track:
    track_id: int
    body: BodyTrack
    hands: dict[str, HandTrack]
    face: FaceTrack | None


class LandmarkTracker:
    """`step(image, t)` -> the tracked people this frame. parts: a subset of PARTS that
    includes "body". Counters: frames, detector_runs."""

    def __init__(
        self,
        detector: PersonDetector,
        parts: Iterable[str] = ("body",),
        max_people: int = 1,
        detect_every: int = 10,
        body: BodyLandmarker | None = None,
        hands: HandLandmarker | None = None,
        face: FaceLandmarker | None = None,
    ) -> None:
        self.parts = tuple(parts)
        unknown = set(self.parts) - set(PARTS)
        if unknown or "body" not in self.parts:
            raise DetectorError(f"parts must include 'body' and be among {PARTS}: {self.parts}")
        if max_people < 1 or detect_every < 1:
            raise DetectorError(
                f"max_people and detect_every must be >= 1: {max_people}, {detect_every}"
            )
        self.detector = detector
        self.max_people = max_people
        self.detect_every = detect_every
        self.body = body or BodyLandmarker()
        self.hand_model = (hands or HandLandmarker()) if "hands" in self.parts else None
        self.face_model = (face or FaceLandmarker()) if "face" in self.parts else None
        self.tracks: list[_Track] = []
        self.frames = 0
        self.detector_runs = 0
        self._next_id = 0

    def _needs_detection(self) -> bool:
        if not self.tracks:
            return True
        return len(self.tracks) < self.max_people and self.frames % self.detect_every == 0

    def _detect(self, image: np.ndarray, colour_order: str) -> None:
        self.detector_runs += 1
        found = self.detector.detect(image, colour_order)
        for i in np.argsort(-found.scores):
            if len(self.tracks) >= self.max_people:
                break
            roi = roi_from_detection(found.keypoints[i].astype(np.float64))
            live = [t.body.roi for t in self.tracks if t.body.roi is not None]
            if any(same_person(roi, r) for r in live):
                continue
            hands = (
                {s: HandTrack(self.hand_model, s) for s in ("left", "right")}
                if self.hand_model
                else {}
            )
            face = FaceTrack(self.face_model) if self.face_model else None
            body = BodyTrack(self.body, found.keypoints[i])
            self.tracks.append(_Track(self._next_id, body, hands, face))
            self._next_id += 1

    def step(self, image: np.ndarray, t: float, colour_order: str = "bgr") -> list[PersonLandmarks]:
        if self._needs_detection():
            self._detect(image, colour_order)
        self.frames += 1
        people: list[PersonLandmarks] = []
        alive: list[_Track] = []
        for track in self.tracks:
            body = track.body.step(image, t, colour_order)
            if body is None:
                continue
            alive.append(track)
            person = PersonLandmarks(track.track_id, body)
            for side, hand in track.hands.items():
                person.hands[side] = hand.step(image, body.xy, body.visibility, colour_order)
            if track.face is not None:
                person.face = track.face.step(image, body.xy, colour_order)
            people.append(person)
        self.tracks = alive
        return people
