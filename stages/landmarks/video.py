"""One recorded video's people, frame by frame: LandmarkTracker's body (and hand) keypoints
(MediaPipe's real weights) placed on Sapiens2's 308 keypoints by stages/landmarks/schema.py
`to_308`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import cv2
import numpy as np

from pipeline.errors import NpucamError
from stages.landmarks.detection import PoseDetector
from stages.landmarks.schema import to_308
from stages.landmarks.tracker import LandmarkTracker

N_KEYPOINTS = 308


class VideoError(NpucamError):
    """A video that cannot be read; names the file."""


@dataclass(frozen=True)
class VideoPeople:
    """keypoints float64 [T, P, 308, 3] (x px, y px, score; NaN where track p is not seen in
    frame t), track p being the tracker's p-th track id; size (width, height) as decoded."""

    keypoints: np.ndarray
    track_ids: tuple[int, ...]
    size: tuple[int, int]


def video_people(
    path: str | os.PathLike,
    max_people: int = 1,
    frames: int = 0,
    fps: float = 60.0,
    hands: bool = False,
) -> VideoPeople:
    """The first `frames` frames (0: all) of the video through one LandmarkTracker (body, and
    the hands when asked; frame i at i / fps seconds)."""
    parts = ("body", "hands") if hands else ("body",)
    tracker = LandmarkTracker(PoseDetector(), parts=parts, max_people=max_people)
    cap = cv2.VideoCapture(os.fspath(path))
    if not cap.isOpened():
        raise VideoError(f"{path}: cannot open as a video")
    found: list[dict[int, np.ndarray]] = []
    size = (0, 0)
    try:
        while frames <= 0 or len(found) < frames:
            ok, image = cap.read()
            if not ok:
                break
            size = (image.shape[1], image.shape[0])
            row = {}
            for person in tracker.step(image, len(found) / fps):
                found_hands = {
                    side: (h.xy, h.flag) if h is not None else None
                    for side, h in person.hands.items()
                }
                xy, score = to_308(person.body.xy, person.body.visibility, found_hands)
                row[person.track_id] = np.column_stack([xy, score])
            found.append(row)
    finally:
        cap.release()
    if not found:
        raise VideoError(f"{path}: no frame decoded")
    ids = tuple(sorted({i for row in found for i in row}))
    out = np.full((len(found), len(ids), N_KEYPOINTS, 3), np.nan)
    for t, row in enumerate(found):
        for p, track in enumerate(ids):
            if track in row:
                out[t, p] = row[track]
    return VideoPeople(out, ids, size)
