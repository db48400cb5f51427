"""Faces blurred before a frame is stored (the record stage's `blur_faces`): each frame waits
for the detect stage's Detections of the same (camera, seq), and its `face` boxes, grown by a
margin, are blurred on a copy of the image: the region shrunk to BLUR_PIXELS on its larger
side by area averaging (cv2.INTER_AREA) and scaled back bilinearly (cv2.INTER_LINEAR), so no
detail finer than a twelfth of the face survives. A Gaussian of the same reach (sigma a sixth
of the face) took ~1 s per 300x360 face on the dev VM. A frame that gets no Detections
(detect skipped it, or its Detections were dropped) is never stored unblurred: FaceJoin gives
it up."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import cv2
import numpy as np

from pipeline.messages import Detections, Frame

FACE_LABEL = "face"
BLUR_PIXELS = 12  # a blurred region keeps this many pixels across its larger side


def blur_boxes(image: np.ndarray, boxes: np.ndarray, margin: float) -> np.ndarray:
    """image: uint8 [H, W, 3]; boxes: float32 [N, 4] (x1, y1, x2, y2) px. A copy with each box,
    grown by `margin` of its size on every side and clipped to the image, blurred; the image
    itself when there are no boxes."""
    if len(boxes) == 0:
        return image
    out = image.copy()
    h, w = image.shape[:2]
    for x1, y1, x2, y2 in np.asarray(boxes, np.float64).reshape(-1, 4):
        mx, my = margin * (x2 - x1), margin * (y2 - y1)
        left, top = max(0, int(np.floor(x1 - mx))), max(0, int(np.floor(y1 - my)))
        right, bottom = min(w, int(np.ceil(x2 + mx))), min(h, int(np.ceil(y2 + my)))
        if right <= left or bottom <= top:
            continue
        out[top:bottom, left:right] = blur_region(out[top:bottom, left:right])
    return out


def blur_region(roi: np.ndarray) -> np.ndarray:
    """roi: uint8 [h, w, 3] -> the same size, shrunk to BLUR_PIXELS on its larger side
    (area average) and scaled back (bilinear)."""
    h, w = roi.shape[:2]
    scale = BLUR_PIXELS / max(h, w)
    if scale >= 1:
        small = cv2.resize(roi, (1, 1), interpolation=cv2.INTER_AREA)
    else:
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        small = cv2.resize(roi, size, interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR)


def face_boxes(detections: Detections) -> np.ndarray:
    """float32 [F, 4]: the boxes labelled `face`."""
    keep = [i for i, label in enumerate(detections.labels) if label == FACE_LABEL]
    return np.asarray(detections.boxes, np.float32).reshape(-1, 4)[keep]


@dataclass
class _Camera:
    frames: OrderedDict[int, Frame] = field(default_factory=OrderedDict)
    faces: OrderedDict[int, np.ndarray] = field(default_factory=OrderedDict)


class FaceJoin:
    """Frames and their Detections, joined by (camera, seq). Detect handles a camera's frames
    in order, so once a frame is matched every earlier frame of its camera still waiting will
    never be: it is given up. At most `limit` frames (and detections) wait per camera."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._cameras: dict[str, _Camera] = {}

    def frame(self, frame: Frame) -> tuple[list[tuple[Frame, np.ndarray]], list[Frame]]:
        """(frames ready, with their face boxes; frames given up)."""
        cam = self._cameras.setdefault(frame.camera, _Camera())
        faces = cam.faces.pop(frame.seq, None)
        if faces is None:
            cam.frames[frame.seq] = frame
            return [], self._trim(cam)
        return [(frame, faces)], self._before(cam, frame.seq)

    def detections(self, det: Detections) -> tuple[list[tuple[Frame, np.ndarray]], list[Frame]]:
        """(frames ready, with their face boxes; frames given up)."""
        cam = self._cameras.setdefault(det.camera, _Camera())
        frame = cam.frames.pop(det.seq, None)
        if frame is None:
            cam.faces[det.seq] = face_boxes(det)
            while len(cam.faces) > self.limit:
                cam.faces.popitem(last=False)
            return [], []
        return [(frame, face_boxes(det))], self._before(cam, det.seq)

    def pending(self) -> list[Frame]:
        """Every frame still waiting (at the end of the run: never stored)."""
        return [f for cam in self._cameras.values() for f in cam.frames.values()]

    def _before(self, cam: _Camera, seq: int) -> list[Frame]:
        for old in [s for s in cam.faces if s < seq]:
            del cam.faces[old]
        return [cam.frames.pop(s) for s in [s for s in cam.frames if s < seq]]

    def _trim(self, cam: _Camera) -> list[Frame]:
        dropped = []
        while len(cam.frames) > self.limit:
            dropped.append(cam.frames.popitem(last=False)[1])
        return dropped
