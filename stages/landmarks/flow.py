"""Points carried from one frame to the next by pyramidal Lucas-Kanade optical flow with a
forward-backward check (cv2.calcOpticalFlowPyrLK both ways; a point whose round trip misses its
start by more than `max_fb_px` is not tracked)."""

from __future__ import annotations

import cv2
import numpy as np

LK_PARAMS = {
    "winSize": (21, 21),
    "maxLevel": 3,
    "criteria": (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 30, 0.01),
}


def track(
    prev_gray: np.ndarray, gray: np.ndarray, points: np.ndarray, max_fb_px: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """points float [N, 2] in prev_gray -> (float64 [N, 2] in gray, bool [N] tracked).
    Non-finite points are not tracked; untracked rows keep their input position."""
    pts = np.asarray(points, np.float64)
    out = pts.copy()
    ok = np.isfinite(pts).all(axis=1)
    if not ok.any():
        return out, ok
    p0 = pts[ok].astype(np.float32).reshape(-1, 1, 2)
    p1, st1, _ = cv2.calcOpticalFlowPyrLK(prev_gray, gray, p0, None, **LK_PARAMS)
    p0b, st2, _ = cv2.calcOpticalFlowPyrLK(gray, prev_gray, p1, None, **LK_PARAMS)
    fb = np.linalg.norm((p0b - p0).reshape(-1, 2), axis=1)
    good = (st1.reshape(-1) == 1) & (st2.reshape(-1) == 1) & (fb <= max_fb_px)
    idx = np.flatnonzero(ok)
    out[idx[good]] = p1.reshape(-1, 2)[good]
    ok[idx[~good]] = False
    return out, ok
