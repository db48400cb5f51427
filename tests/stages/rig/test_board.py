"""Boards and their corners in an image (stages/rig/board.py), on the rendered ChArUco rig of
conftest.py, whose world frame is the board's in capture 0 turned z-up (BOARD_TO_WORLD).
"""

from __future__ import annotations

import numpy as np
import pytest
from rig_scenes import BOARD

from stages.rig.board import Charuco, Checkerboard
from stages.rig.calibrate import BOARD_TO_WORLD, detect_views
from stages.rig.calibration import CalibrationError


def test_charuco_corners_land_on_the_true_projections(charuco_rig):
    for cam, images in zip(charuco_rig.cameras, charuco_rig.images, strict=True):
        view = BOARD.detect(images[0])
        assert len(view.ids) == len(BOARD.object_points)  # the frontal view shows every corner
        world = BOARD.object_points[view.ids] @ BOARD_TO_WORLD  # its own inverse
        err = np.linalg.norm(cam.project(world) - view.image_points, axis=1)
        assert err.max() < 0.3


def test_blank_image_has_no_board():
    blank = np.full((480, 640, 3), 255, np.uint8)
    assert BOARD.detect(blank) is None
    assert Checkerboard((8, 5), 0.06).detect(blank) is None


def test_bad_image_names_the_camera_and_image():
    with pytest.raises(CalibrationError, match="camera 'top' image 0: board images must be uint8"):
        detect_views(BOARD, "top", [np.zeros((48, 64), np.float32)])


def test_bad_boards_are_refused():
    with pytest.raises(CalibrationError, match="unknown ArUco dictionary"):
        Charuco((5, 5), 0.04, 0.03, "DICT_9X9_1")
    with pytest.raises(CalibrationError, match="need 55 markers, DICT_4X4_50 has 50"):
        Charuco((10, 11), 0.04, 0.03)
    with pytest.raises(CalibrationError, match="marker_length < square_length"):
        Charuco((5, 5), 0.04, 0.05)
    with pytest.raises(CalibrationError, match="square_length > 0"):
        Checkerboard((8, 5), 0.0)
