"""Degenerate calibrations (issue 33, low finding): a rotation of 1e308, a focal length of
1e-300 px, or every camera of a rig at one pose passed `validate`, and the rig then
triangulated nothing without a word. Now a camera's Rodrigues vector must give a rotation
(angle at most 100 rad, R orthonormal), fx and fy lie in 1-1e6 px, the translation within
1e9 (stages/rig/calibration.py), and a rig's cameras must stand apart (rig3d's check names
the two at one place).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages" / "rig"))

from rig_scenes import ring_cameras  # noqa: E402

from pipeline.config import ConfigError, parse_config  # noqa: E402
from pipeline.graph import check_stages  # noqa: E402
from stages.rig.calibration import (  # noqa: E402
    Calibration,
    CalibrationError,
    Camera,
    read_calibration,
    write_calibration,
)

NAMES = ("cam0", "cam1", "cam2")


def cameras() -> list[Camera]:
    return ring_cameras(np.random.default_rng(4), n=len(NAMES))


def changed(cam: Camera, **fields) -> Camera:
    values = {
        "name": cam.name,
        "size": cam.size,
        "matrix": cam.matrix,
        "distortions": cam.distortions,
        "rotation": cam.rotation,
        "translation": cam.translation,
    }
    return Camera(**{**values, **fields})


def write(path: Path, cams: list[Camera]) -> Path:
    write_calibration(path, Calibration({f"cam_{i + 1:02d}": c for i, c in enumerate(cams)}))
    return path


def with_focal(cam: Camera, f: float) -> Camera:
    m = np.array(cam.matrix)
    m[0, 0] = f
    return changed(cam, matrix=m)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: changed(c, rotation=[1e308, 0.0, 0.0]), r"\[cam_01\] rotation: .* over 100"),
        (lambda c: with_focal(c, 1e-300), r"\[cam_01\] matrix: .* fx, fy 1-1e\+06 px"),
        (lambda c: changed(c, translation=[1e300, 0.0, 0.0]), r"\[cam_01\] translation: "),
    ],
    ids=["rotation 1e308", "fx 1e-300", "translation 1e300"],
)
def test_a_degenerate_camera_is_refused_naming_the_table_and_key(tmp_path, change, message):
    cams = cameras()
    path = write(tmp_path / "Calib.toml", [change(cams[0]), *cams[1:]])
    with pytest.raises(CalibrationError, match=message):
        read_calibration(path)


def test_a_rig_whose_cameras_share_one_pose_is_refused_by_validate(tmp_path):
    cams = cameras()
    same = [changed(c, rotation=cams[0].rotation, translation=cams[0].translation) for c in cams]
    write(tmp_path / "Calib.toml", same)
    config = parse_config(
        {
            "cameras": [{"name": n, "url": "synthetic:", "fps": 10.0} for n in NAMES],
            "stages": [
                {"kind": "capture"},
                {"kind": "detect", "person": "none", "face": "none"},
                {
                    "kind": "rig3d",
                    "rig": "hall",
                    "cameras": list(NAMES),
                    "calibration": "Calib.toml",
                },
            ],
        },
        tmp_path / "rig.toml",
    )
    with pytest.raises(ConfigError) as err:
        check_stages(config)
    text = str(err.value)
    assert "stages[2].calibration: cameras 'cam0' and 'cam1' are at one place" in text
    assert "'cam1' and 'cam2'" in text
