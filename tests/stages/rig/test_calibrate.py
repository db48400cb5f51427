"""Rig calibration from rendered board views (stages/rig/calibrate.py, stages/rig/board.py).

The scenes (rig_scenes.py; the ChArUco one shared through conftest.py) warp cv2's ChArUco or
checkerboard image into virtual cameras with known intrinsics, distortion and poses, with blur
and grey-level noise. Tolerances are the issue's: focal length and principal point within 1%,
extrinsic translation within 1 cm and rotation within 0.5 degrees; this scene lands at ~0.2%,
~1.3 mm and ~0.05 degrees.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from rig_scenes import BOARD, board_scene, checkerboard_texture

from stages.rig.board import Checkerboard
from stages.rig.calibrate import (
    CameraViews,
    calibrate_intrinsics,
    calibrate_rig,
    detect_views,
)
from stages.rig.calibration import CalibrationError, read_calibration, write_calibration


@pytest.fixture
def scene(charuco_rig):
    return charuco_rig


@pytest.fixture
def views(charuco_views):
    return charuco_views


def angle_deg(r_a: np.ndarray, r_b: np.ndarray) -> float:
    return float(np.degrees(np.linalg.norm(cv2.Rodrigues(r_a @ r_b.T)[0])))


def test_rig_calibration_recovers_intrinsics_and_extrinsics(scene, views):
    rig = calibrate_rig(BOARD, views, world_view=0)
    assert list(rig.calibration.cameras) == ["cam_01", "cam_02", "cam_03", "cam_04"]
    for truth, got, report in zip(
        scene.cameras, rig.calibration.cameras.values(), rig.cameras, strict=True
    ):
        assert got.name == truth.name and got.size == truth.size
        k, kt = got.matrix, truth.matrix
        for i, j in ((0, 0), (1, 1), (0, 2), (1, 2)):
            assert abs(k[i, j] / kt[i, j] - 1) < 0.01, (truth.name, i, j)
        assert np.linalg.norm(got.translation - truth.translation) < 0.01
        assert angle_deg(got.extrinsics[:, :3], truth.extrinsics[:, :3]) < 0.5
        assert report.shared_views >= 15 and report.rms < 0.5
        assert got.centre[2] > 0.5  # world z points out of the board's face, at the cameras
    assert rig.calibration.metadata == {"adjusted": True, "error": rig.rms}


def test_camera_zero_world_holds_the_relative_poses(scene, views):
    intrinsics = [calibrate_intrinsics(BOARD, v) for v in views]
    rig = calibrate_rig(BOARD, views, intrinsics=intrinsics)
    cams = list(rig.calibration.cameras.values())
    assert np.array_equal(cams[0].rotation, np.zeros(3))
    assert np.array_equal(cams[0].translation, np.zeros(3))
    r0, t0 = scene.cameras[0].extrinsics[:, :3], scene.cameras[0].translation
    for truth, got in zip(scene.cameras[1:], cams[1:], strict=True):
        r_rel = truth.extrinsics[:, :3] @ r0.T  # camera 0 -> this camera
        t_rel = truth.translation - r_rel @ t0
        assert np.linalg.norm(got.translation - t_rel) < 0.01
        assert angle_deg(got.extrinsics[:, :3], r_rel) < 0.5


def test_written_rig_calibration_reads_back(tmp_path, views):
    rig = calibrate_rig(BOARD, views[:2])
    path = tmp_path / "Calib.toml"
    write_calibration(path, rig.calibration)
    back = read_calibration(path)
    for a, b in zip(rig.calibration.cameras.values(), back.cameras.values(), strict=True):
        assert np.array_equal(a.matrix, b.matrix) and np.array_equal(a.rotation, b.rotation)
        assert len(b.distortions) == 4  # k1, k2, p1, p2: k3 held at 0, as Pose2Sim writes


@pytest.mark.slow  # ~9 s of CPU (OpenCV's classic detector spends ~1 s on each of the 5
# views it misses), 35 s on 4 workers; the default run calibrates a checkerboard on the
# Pose2Sim demo's real images (test_calibrate_demo.py)
def test_checkerboard_gives_intrinsics():
    board = Checkerboard((8, 5), 0.06)
    scene = board_scene(checkerboard_texture(board), (0.54, 0.36), n_cameras=1)
    intr = calibrate_intrinsics(board, detect_views(board, "cam0", scene.images[0]))
    k, kt = intr.matrix, scene.cameras[0].matrix
    assert intr.views >= 12
    for i, j in ((0, 0), (1, 1), (0, 2), (1, 2)):
        assert abs(k[i, j] / kt[i, j] - 1) < 0.01


def test_checkerboard_cannot_give_extrinsics(views):
    with pytest.raises(CalibrationError, match="extrinsics need a ChArUco board"):
        calibrate_rig(Checkerboard((8, 5), 0.06), views)


def test_board_not_found_names_the_camera():
    blank = [np.full((480, 640), 255, np.uint8)] * 4
    cam = detect_views(BOARD, "door", blank)
    with pytest.raises(CalibrationError, match="camera 'door': the board was not found in any"):
        calibrate_intrinsics(BOARD, cam)


def test_too_few_views_names_the_camera_and_the_minimum(views):
    two = CameraViews("left", views[0].size, views[0].views[:2])
    with pytest.raises(CalibrationError, match="camera 'left': .* 2 of 2 images; .* at least 3"):
        calibrate_intrinsics(BOARD, two)


def test_inconsistent_image_sizes_name_the_camera_and_image(scene):
    images = scene.images[1][:3] + [cv2.resize(scene.images[1][3], (640, 480))]
    with pytest.raises(CalibrationError, match="camera 'cam1': image 3 is 640x480 but image 0 is"):
        detect_views(BOARD, "cam1", images)


def test_camera_without_shared_views_is_named(views):
    # cameras 0-2 keep captures 0-9, camera 3 only 10-19: no capture links camera 3
    split = [CameraViews(v.name, v.size, v.views[:10] + (None,) * 10) for v in views[:3]] + [
        CameraViews(views[3].name, views[3].size, (None,) * 10 + views[3].views[10:])
    ]
    with pytest.raises(CalibrationError, match=r"camera\(s\) 'cam3' share no view .* 'cam0'"):
        calibrate_rig(BOARD, split)
