"""The rendered ChArUco rig shared by the board and calibration tests (~5 s to render and
detect, once per session)."""

from __future__ import annotations

import pytest
from rig_scenes import BOARD, board_scene, charuco_texture

from stages.rig.calibrate import detect_views


@pytest.fixture(scope="session")
def charuco_rig():
    return board_scene(charuco_texture(), (0.56, 0.40))


@pytest.fixture(scope="session")
def charuco_views(charuco_rig):
    return [
        detect_views(BOARD, c.name, imgs)
        for c, imgs in zip(charuco_rig.cameras, charuco_rig.images, strict=True)
    ]
