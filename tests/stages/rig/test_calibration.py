"""The calibration file and camera model (stages/rig/calibration.py).

Fixtures in data/, retyped from upstream repositories: pose2sim_Calib_qualisys.toml is
Pose2Sim's Pose2Sim/S00_Demo_Session/S00_Calibration/Calib_qualisys.toml (written by its
calibration.py toml_write); anipose_7cam_allen_mouse_2cams.toml is the first two cameras and
the metadata of aniposelib's tests/data/calib/7cam-allen-mouse/calibration.toml (written by
aniposelib's CameraGroup.dump through the toml package: int sizes, trailing commas, five
distortion coefficients, no fisheye key).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from stages.rig.calibration import (
    Calibration,
    CalibrationError,
    Camera,
    format_calibration,
    parse_calibration,
    read_calibration,
    write_calibration,
)

DATA = Path(__file__).parent / "data"
POSE2SIM = DATA / "pose2sim_Calib_qualisys.toml"
ANIPOSE = DATA / "anipose_7cam_allen_mouse_2cams.toml"


def assert_same(a: Calibration, b: Calibration) -> None:
    assert list(a.cameras) == list(b.cameras)
    assert a.metadata == b.metadata
    for ca, cb in zip(a.cameras.values(), b.cameras.values(), strict=True):
        assert (ca.name, ca.size, ca.fisheye) == (cb.name, cb.size, cb.fisheye)
        for field in ("matrix", "distortions", "rotation", "translation"):
            assert np.array_equal(getattr(ca, field), getattr(cb, field)), field


def test_pose2sim_file_round_trips_byte_for_byte(tmp_path):
    first = read_calibration(POSE2SIM)
    out = tmp_path / "Calib.toml"
    write_calibration(out, first)
    assert out.read_text() == POSE2SIM.read_text()
    assert_same(read_calibration(out), first)


def test_pose2sim_file_reads_as_pose2sim_reads_it():
    calib = read_calibration(POSE2SIM)
    assert list(calib.cameras) == ["cam_01", "cam_02", "cam_03", "cam_04"]
    cam = calib.camera("cam_03")
    assert cam.size == (1088, 1920)  # [w, h]: Pose2Sim's S.append([w, h]), portrait video
    assert cam.matrix[0, 2] == 513.20837403125 and cam.matrix[1, 1] == 1681.509887703125
    assert cam.distortions.tolist() == [-0.000729765625, 0.00215034375, -8.46875e-06, -8.078125e-06]
    assert cam.translation.tolist() == [-0.7934803899999995, 0.32283594000000126, 4.353514870000001]
    assert not cam.fisheye
    assert calib.metadata == {"adjusted": False, "error": 0.0}
    # world -> camera as OpenCV's rvec / tvec: the rig's cameras sit ~3-4.5 m from the origin
    dists = [np.linalg.norm(c.centre) for c in calib.cameras.values()]
    assert all(2.5 < d < 5 for d in dists)


def test_anipose_file_round_trips_its_values(tmp_path):
    first = read_calibration(ANIPOSE)
    assert [c.name for c in first.cameras.values()] == ["cam088", "cam091"]
    assert first.camera("cam091").size == (1440, 1080)
    assert len(first.camera("cam091").distortions) == 5
    assert first.metadata == {"adjusted": True, "error": 1.6680509250648916}
    out = tmp_path / "calibration.toml"
    write_calibration(out, first)
    assert_same(read_calibration(out), first)


def test_older_pose2sim_column_vectors_read_as_vectors():
    text = POSE2SIM.read_text().replace(
        "rotation = [ 1.34975875, 1.5963809099999993, -1.1983285799999999]",
        "rotation = [ [1.34975875], [1.5963809099999993], [-1.1983285799999999]]",
    )
    cam = parse_calibration(text).camera("cam_02")
    assert cam.rotation.tolist() == [1.34975875, 1.5963809099999993, -1.1983285799999999]


def test_fisheye_flag_and_metadata_lists_round_trip():
    text = (
        POSE2SIM.read_text()
        .replace(
            "distortions = [ -0.000721609375, 0.002187234375, 9.5e-06, 1.078125e-05]\n"
            "rotation = [ 1.6882754799999993",
            "distortions = [ 0.01, -0.02, 0.003, -0.0004]\nrotation = [ 1.6882754799999993",
        )
        .replace("fisheye = false\n\n[cam_02]", "fisheye = true\n\n[cam_02]")
        .replace("error = 0.0\n", "error = [0.31, 0.42, 0.5, 0.25]\n")
    )
    calib = parse_calibration(text)
    assert calib.camera("cam_01").fisheye and not calib.camera("cam_02").fisheye
    assert format_calibration(calib) == text


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('name = "cam_02"\n', "", r"\[cam_02\]: missing name"),
        ("size = [ 1088.0, 1920.0]", "size = [ 1088.5, 1920.0]", r"\[cam_01\] size: .*whole"),
        ("size = [ 1088.0, 1920.0]", "size = [ 1088.0]", r"\[cam_01\] size: expected \[width"),
        ("[ 0.0, 0.0, 1.0]]", "[ 0.0, 0.0, 2.0]]", r"\[cam_01\] matrix: expected \[\[fx"),
        ("[ 0.0, 0.0, 1.0]]", "[ 0.0, 0.0]]", r"\[cam_01\] matrix: expected a 3x3"),
        ("9.5e-06, 1.078125e-05]", "9.5e-06]", r"\[cam_01\] distortions: expected 4 or 5"),
        ("-0.41955852000000016]", '"x"]', r"\[cam_01\] rotation: expected a Rodrigues"),
        ("2.8907130499999996]", "nan]", r"\[cam_01\] translation: every value must be finite"),
        ("fisheye = false\n\n[cam_02]", 'fisheye = "no"\n\n[cam_02]', r"\[cam_01\] fisheye"),
        ('name = "cam_04"', 'name = "cam_03"', r"\[cam_04\] name: 'cam_03' is also .*\[cam_03\]"),
        ("error = 0.0", "error = { a = 1 }", r"\[metadata\] error: expected a number"),
        ("[cam_01]", "[cam_01", r"not valid TOML"),
    ],
)
def test_bad_files_name_the_file_table_and_key(tmp_path, old, new, message):
    path = tmp_path / "bad.toml"
    text = POSE2SIM.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(CalibrationError, match=rf"{path}: .*{message}"):
        read_calibration(path)


def test_a_file_without_cameras_or_too_large_is_refused(tmp_path):
    path = tmp_path / "meta.toml"
    path.write_text("[metadata]\nadjusted = false\n")
    with pytest.raises(CalibrationError, match="no camera table"):
        read_calibration(path)
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(CalibrationError, match="larger than"):
        read_calibration(path)
    with pytest.raises(CalibrationError, match="cannot read"):
        read_calibration(tmp_path / "missing.toml")


def test_unknown_camera_name_lists_the_known_ones():
    with pytest.raises(CalibrationError, match="'cam_01', 'cam_02'"):
        read_calibration(POSE2SIM).camera("front")


def _camera(fisheye: bool) -> Camera:
    dist = [0.05, -0.01, 0.002, -0.001] if fisheye else [-0.22, 0.07, 0.001, -0.0015, -0.01]
    return Camera(
        "c",
        (1280, 960),
        [[900, 0, 650], [0, 905, 470], [0, 0, 1]],
        dist,
        [0.1, -0.4, 0.05],
        [0.2, -0.1, 3.0],
        fisheye,
    )


@pytest.mark.parametrize("fisheye", [False, True])
def test_normalize_inverts_project_through_the_lens(fisheye):
    """Camera.normalize(Camera.project(X)) is X's pinhole direction within 1e-4 px: the lens
    inverse the triangulation and the rendered test scenes rely on."""
    cam = _camera(fisheye)
    rng = np.random.default_rng(0)
    local = np.column_stack(
        [rng.uniform([-0.65, -0.48], [0.65, 0.48], (500, 2)) * 2.0, np.full(500, 2.0)]
    )
    rot = cv2.Rodrigues(cam.rotation)[0]
    world = (local - cam.translation) @ rot  # R^T (x - t), row-wise
    px = cam.project(world)
    assert ((px >= 0) & (px < cam.size)).all()
    err = (cam.normalize(px) - local[:, :2] / local[:, 2:]) * cam.focal
    assert np.abs(err).max() < 1e-4
