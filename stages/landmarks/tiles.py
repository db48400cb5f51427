"""A person detector run on the whole frame and on overlapping square tiles along its long side,
for seeding landmark tracks of several people (docs/live-pose.md, "Seeding detector").

BlazePose's detector sees the frame fitted into 224x224: on a portrait 1088x1920 view a person
is a few dozen input pixels tall and, found through the head, often missed when seen from
behind or next to a clearer person. Each square tile (side = the short side) gives it a 1.8x
larger view. Detections from every pass are mapped back to the frame and merged: one whose
pose ROI (stages.landmarks.body.roi_from_detection) is, by LandmarkTracker's own test
(`same_person`: centres within 0.2 ROI sides), a better-scoring one's is that person.
"""

from __future__ import annotations

import math

import numpy as np

from stages.detectors.detections import DetectorError, DetectorOutput, check_image
from stages.landmarks.body import roi_from_detection
from stages.landmarks.tracker import PersonDetector, same_person


def tile_offsets(width: int, height: int, overlap: float) -> list[tuple[int, int]]:
    """Top-left corners of the square tiles (side = the short side) covering the frame along
    its long side, consecutive tiles sharing at least `overlap` of a side; none for a frame
    that is already square."""
    short, long = min(width, height), max(width, height)
    if long == short:
        return []
    step = short * (1.0 - overlap)
    n = math.ceil((long - short) / step) + 1
    starts = [round(i * (long - short) / (n - 1)) for i in range(n)]
    return [(s, 0) if width > height else (0, s) for s in starts]


class TiledDetector:
    """`detect(image) -> DetectorOutput`: `base` on the whole frame and on its tiles, merged
    (module doc). Keypoints must be BlazePose's 4 (the ROI comes from them); boxes are the
    keypoints' extent, as stages.landmarks.detection.PoseDetector gives them. Counter:
    passes (base detector runs)."""

    def __init__(self, base: PersonDetector, overlap: float = 0.5) -> None:
        if not 0.0 <= overlap < 1.0:
            raise DetectorError(f"tile overlap must be in [0, 1): {overlap}")
        self.base = base
        self.overlap = overlap
        self.passes = 0

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        check_image(image)
        h, w = image.shape[:2]
        side = min(w, h)
        found = [self._run(image, colour_order)]
        for x0, y0 in tile_offsets(w, h, self.overlap):
            tile = np.ascontiguousarray(image[y0 : y0 + side, x0 : x0 + side])
            out = self._run(tile, colour_order)
            shift = np.array([x0, y0], np.float32)
            found.append(
                DetectorOutput(
                    out.boxes + np.concatenate([shift, [0, 0]]).astype(np.float32),
                    out.scores,
                    out.keypoints + shift,
                    out.names,
                )
            )
        return self._merge(found)

    def _run(self, image: np.ndarray, colour_order: str) -> DetectorOutput:
        self.passes += 1
        return self.base.detect(image, colour_order)

    def _merge(self, found: list[DetectorOutput]) -> DetectorOutput:
        found = [f for f in found if len(f)]
        if not found:
            return DetectorOutput.empty(4, found[0].names if found else ())
        boxes = np.concatenate([f.boxes for f in found])
        scores = np.concatenate([f.scores for f in found])
        keypoints = np.concatenate([f.keypoints for f in found])
        if keypoints.shape[1] < 2:
            raise DetectorError("a tiled detector needs BlazePose's keypoints (hip centre, scale)")
        rois = [roi_from_detection(k.astype(np.float64)) for k in keypoints]
        kept: list[int] = []
        for i in np.argsort(-scores, kind="stable"):
            if not any(same_person(rois[i], rois[j]) for j in kept):
                kept.append(int(i))
        return DetectorOutput(boxes[kept], scores[kept], keypoints[kept], found[0].names)
