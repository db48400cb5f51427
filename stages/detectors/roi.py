"""Fixed regions of interest for kiosks: the regions themselves as boxes, or a detector run
inside each region (a small face in a large frame becomes a large face in its crop).

Regions are x, y, w, h in pixels, or in [0, 1] fractions of the frame when `normalized`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from stages.detectors.detections import DetectorError, DetectorOutput, check_image


@dataclass(frozen=True)
class Region:
    """One named region: x, y, w, h (pixels, or fractions of the frame if normalized)."""

    name: str
    x: float
    y: float
    w: float
    h: float
    normalized: bool = False

    def __post_init__(self) -> None:
        vals = (self.x, self.y, self.w, self.h)
        if not all(np.isfinite(v) for v in vals) or self.w <= 0 or self.h <= 0:
            raise DetectorError(f"region {self.name!r}: needs finite x, y and w, h > 0: {vals}")
        if self.normalized and not (0 <= self.x < 1 and 0 <= self.y < 1):
            raise DetectorError(f"region {self.name!r}: normalized x, y must be in [0, 1)")

    def pixels(self, width: int, height: int) -> tuple[int, int, int, int]:
        """The region clipped to a width x height frame, as integer x0, y0, x1, y1."""
        sx, sy = (width, height) if self.normalized else (1, 1)
        x0 = int(np.clip(np.floor(self.x * sx), 0, width))
        y0 = int(np.clip(np.floor(self.y * sy), 0, height))
        x1 = int(np.clip(np.ceil((self.x + self.w) * sx), 0, width))
        y1 = int(np.clip(np.ceil((self.y + self.h) * sy), 0, height))
        if x1 - x0 < 1 or y1 - y0 < 1:
            raise DetectorError(f"region {self.name!r} lies outside the {width}x{height} frame")
        return x0, y0, x1, y1


class Detector(Protocol):
    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput: ...


class FixedRegions:
    """`detect(image)`: every region as a box with score 1.0 (e.g. kiosk person boxes).

    extra["region"] holds each box's region index (int32 [N]).
    """

    def __init__(self, regions: Sequence[Region]) -> None:
        if not regions:
            raise DetectorError("FixedRegions needs at least one region")
        names = [r.name for r in regions]
        if len(set(names)) != len(names):
            raise DetectorError(f"region names must be unique: {names}")
        self.regions = tuple(regions)

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        check_image(image)
        h, w = image.shape[:2]
        boxes = []
        for r in self.regions:
            x0, y0, x1, y1 = r.pixels(w, h)
            boxes.append([x0, y0, x1 - x0, y1 - y0])
        n = len(boxes)
        return DetectorOutput(
            np.array(boxes, np.float32),
            np.ones(n, np.float32),
            np.zeros((n, 0, 2), np.float32),
            extra={"region": np.arange(n, dtype=np.int32)},
        )


class DetectInRegions:
    """Run `inner` on each region's crop and map its boxes and keypoints back to the frame.

    DetectorOutput of overlapping regions are all kept (no cross-region suppression);
    extra["region"] says which region found each one.
    """

    def __init__(self, inner: Detector, regions: Sequence[Region]) -> None:
        self.inner = inner
        self.regions = FixedRegions(regions).regions

    def detect(self, image: np.ndarray, colour_order: str = "bgr") -> DetectorOutput:
        check_image(image)
        h, w = image.shape[:2]
        parts: list[DetectorOutput] = []
        region_ids: list[np.ndarray] = []
        for i, r in enumerate(self.regions):
            x0, y0, x1, y1 = r.pixels(w, h)
            d = self.inner.detect(np.ascontiguousarray(image[y0:y1, x0:x1]), colour_order)
            offset = np.array([x0, y0], np.float32)
            d.boxes = d.boxes.copy()
            d.boxes[:, :2] += offset
            d.keypoints = d.keypoints + offset
            parts.append(d)
            region_ids.append(np.full(len(d), i, np.int32))
        k = parts[0].keypoints.shape[1]
        return DetectorOutput(
            np.concatenate([p.boxes for p in parts]).reshape(-1, 4),
            np.concatenate([p.scores for p in parts]),
            np.concatenate([p.keypoints for p in parts]).reshape(-1, k, 2),
            parts[0].names,
            {"region": np.concatenate(region_ids)},
        )
