"""`npucam calibrate --board checkerboard` on Pose2Sim's demo intrinsics images (4x7 inner
corners, 60 mm squares, per Demo_SinglePerson/Config.toml; 7 images a camera, 1088x1920)
against the lab's Qualisys calibration of the same cameras (imported as Pose2Sim does).

Measured (all four cameras; docs/rig.md): focal lengths 0.1-0.9% from Qualisys' (bound
1.5%), reprojection RMS 0.21-0.92 px; the principal points land 31-51 px away, beyond the
issue's 10 px: six or seven views of a small board do not pin the principal point (a
strict xfail holds that miss on record). Pose2Sim's own calibrate_intrinsics of the same
images gives the same lens (its principal points 31-51 px from Qualisys' too), checked on
cam02. One camera runs by default, all four as `slow`.
"""

from __future__ import annotations

import re
import shutil
import tomllib

import numpy as np
import pytest

from pipeline.assets import pose2sim_demo
from pipeline.cli import main
from stages.rig.calibration import read_calibration
from stages.rig.importers import import_calibration
from tests.stages.rig.pose2sim_reference import run_reference

FOCAL_REL = 0.015  # the issue's bound on focal length against Qualisys'
CENTRE_PX = 10.0  # the bound on the principal point
BOARD = ["--board", "checkerboard", "--corners", "4x7", "--square-length", "0.06"]
# npucam against Pose2Sim on the same images: both fit the same model (k3 held at 0) to the
# board's corners; on cam02 they agree to 0.01 px and 0.001%, the bounds leave room for a
# corner refined differently
SAME_FOCAL_REL = 0.002
SAME_CENTRE_PX = 2.0


def calibrate(tmp_path, cameras: list[str], capsys) -> dict:
    demo = pose2sim_demo()
    args = ["calibrate", *BOARD, "--out", str(tmp_path / "lenses.toml")]
    for cam in cameras:
        folder = demo / "calibration" / "intrinsics" / f"int_{cam}_img"
        args += ["--camera", f"{cam}=images:{folder}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    qualisys = import_calibration("qualisys", [demo / "calibration" / "Calib.qca.txt"])
    result = {}
    for lens in read_calibration(tmp_path / "lenses.toml").cameras.values():
        truth = qualisys.camera(lens.name)
        assert lens.size == truth.size == (1088, 1920)
        rms = float(re.search(rf"{lens.name}: intrinsics from \d+ views, RMS ([\d.]+) px", out)[1])
        focal = [lens.matrix[i, i] / truth.matrix[i, i] - 1 for i in (0, 1)]
        centre = np.hypot(*(lens.matrix[:2, 2] - truth.matrix[:2, 2]))
        print(
            f"{lens.name}: RMS {rms:.3f} px, focal {focal[0]:+.2%} {focal[1]:+.2%}, "
            f"principal point {centre:.1f} px from Qualisys'"
        )
        result[lens.name] = (rms, max(abs(f) for f in focal), float(centre))
    assert list(result) == cameras
    return result


def assert_lenses(result: dict) -> None:
    for name, (rms, focal, _) in result.items():
        assert rms < 1.0, name
        assert focal < FOCAL_REL, name


def test_checkerboard_images_give_qualisys_focal_length(tmp_path, capsys):
    assert_lenses(calibrate(tmp_path, ["cam02"], capsys))


@pytest.mark.slow
def test_all_four_cameras_give_qualisys_focal_length(tmp_path, capsys):
    assert_lenses(calibrate(tmp_path, ["cam01", "cam02", "cam03", "cam04"], capsys))


@pytest.mark.xfail(
    strict=True, reason="7 views of a 4x7 board leave the principal point 31-51 px from Qualisys'"
)
def test_checkerboard_principal_point_within_10px_of_qualisys(tmp_path, capsys):
    result = calibrate(tmp_path, ["cam02"], capsys)
    assert all(centre < CENTRE_PX for _, _, centre in result.values())


def test_checkerboard_intrinsics_are_pose2sims_own_of_the_same_images(tmp_path, capsys):
    """Pose2Sim's calibrate_intrinsics (the reference, in .venv-pose2sim) on the same images
    gives npucam's lens, its principal point as far from Qualisys' (cam02: 33 px): the miss
    the xfail above holds is the images', not npucam's."""
    calibrate(tmp_path, ["cam02"], capsys)
    ours = read_calibration(tmp_path / "lenses.toml").camera("cam02")
    calib_dir = tmp_path / "pose2sim"
    images = pose2sim_demo() / "calibration" / "intrinsics" / "int_cam02_img"
    shutil.copytree(images, calib_dir / "intrinsics" / "int_cam02_img")
    out = tmp_path / "pose2sim.toml"
    run_reference("intrinsics", calib_dir, out, "4x7", "60", cwd=tmp_path)
    theirs = np.array(tomllib.loads(out.read_text())["int_cam02_img"]["matrix"])
    focal = [ours.matrix[i, i] / theirs[i, i] - 1 for i in (0, 1)]
    centre = float(np.hypot(*(ours.matrix[:2, 2] - theirs[:2, 2])))
    print(f"npucam against Pose2Sim: focal {focal[0]:+.3%} {focal[1]:+.3%}, centre {centre:.2f} px")
    assert max(map(abs, focal)) < SAME_FOCAL_REL and centre < SAME_CENTRE_PX
    qualisys = import_calibration("qualisys", [pose2sim_demo() / "calibration" / "Calib.qca.txt"])
    assert np.hypot(*(theirs[:2, 2] - qualisys.camera("cam02").matrix[:2, 2])) > CENTRE_PX
