"""Shared detector fixtures: the sample images the detector tests run on (BGR, as Frame)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import skimage.data

from pipeline.assets import asset_path


@pytest.fixture(scope="session")
def astronaut_bgr() -> np.ndarray:
    return cv2.cvtColor(skimage.data.astronaut(), cv2.COLOR_RGB2BGR)


@pytest.fixture(scope="session")
def carphone_frames() -> list[np.ndarray]:
    """Every 10th frame of the carphone clip (a frontal talking face in all 120 frames)."""
    cap = cv2.VideoCapture(str(asset_path("carphone_pristine.mp4")))
    frames = []
    i = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if i % 10 == 0:
            frames.append(frame)
        i += 1
    cap.release()
    assert len(frames) == 12
    return frames
