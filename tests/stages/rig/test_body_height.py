"""stages/rig/body_height.py: a body built to Winter's proportions gives its height back."""

from __future__ import annotations

import numpy as np
import pytest

from npu.models.sapiens2.keypoints import INDEX, NAMES
from stages.rig.body_height import body_height
from stages.rig.calibration import CalibrationError

WINTER = {"ankle": 0.039, "knee": 0.285, "hip": 0.530, "shoulder": 0.818}  # fraction of H


def _standing(height: float, frames: int = 10) -> np.ndarray:
    points = np.full((frames, len(NAMES), 3), np.nan)
    for part, share in WINTER.items():
        for side, y in (("left", 0.1), ("right", -0.1)):
            points[:, INDEX[f"{side}_{part}"]] = (0.0, y, share * height)
    return points


@pytest.mark.parametrize("height", [1.2, 1.7, 1.95])
def test_a_body_of_winters_proportions_gives_its_height(height):
    assert body_height(_standing(height)) == pytest.approx(height)


def test_the_median_over_frames_ignores_a_few_wrong_frames():
    points = _standing(1.7, frames=20)
    points[:3, INDEX["left_knee"], 2] += 0.4  # three frames of a wrong left knee
    assert body_height(points) == pytest.approx(1.7)


def test_one_missing_side_uses_the_other():
    points = _standing(1.7)
    points[:, INDEX["left_knee"]] = np.nan
    assert body_height(points) == pytest.approx(1.7)


def test_a_bone_seen_on_too_few_frames_is_named():
    points = _standing(1.7)
    points[:, INDEX["left_hip"]] = points[:, INDEX["right_hip"]] = np.nan
    with pytest.raises(CalibrationError, match="knee-hip"):
        body_height(points)
