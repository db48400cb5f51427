"""stages/rig/rig_alignment.py against a rig moved by a known similarity."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from stages.rig.calibration import CalibrationError, read_calibration
from stages.rig.rig_alignment import align_rigs

CALIB = Path(__file__).parent / "data" / "pose2sim_Calib_qualisys.toml"


def _moved(cameras, scale, rot, shift):
    """The same rig in a world x' = scale * rot @ x + shift (so the estimate is the rig there)."""
    out = []
    for cam in cameras:
        r = cam.extrinsics[:, :3] @ rot.T
        centre = scale * rot @ cam.centre + shift
        out.append(
            replace(cam, rotation=Rotation.from_matrix(r).as_rotvec(), translation=-r @ centre)
        )
    return out


def test_a_similarity_moved_rig_aligns_exactly():
    truth = list(read_calibration(CALIB).cameras.values())
    rot = Rotation.from_rotvec([0.3, -1.2, 0.5]).as_matrix()
    moved = _moved(truth, 0.25, rot, np.array([4.0, -1.0, 2.0]))
    alignment = align_rigs(moved, truth)
    assert alignment.scale == pytest.approx(4.0)
    np.testing.assert_allclose(alignment.centre_error, 0.0, atol=1e-9)
    np.testing.assert_allclose(alignment.rotation_error, 0.0, atol=1e-6)


def test_one_turned_camera_shows_its_angle_and_no_centre_error():
    truth = list(read_calibration(CALIB).cameras.values())
    turn = Rotation.from_rotvec(np.radians([0.0, 2.0, 0.0])).as_matrix()
    r = turn @ truth[2].extrinsics[:, :3]
    turned = replace(
        truth[2], rotation=Rotation.from_matrix(r).as_rotvec(), translation=-r @ truth[2].centre
    )
    alignment = align_rigs(truth[:2] + [turned] + truth[3:], truth)
    np.testing.assert_allclose(alignment.centre_error, 0.0, atol=1e-9)
    np.testing.assert_allclose(alignment.rotation_error, [0, 0, 2.0, 0], atol=1e-9)


def test_rigs_of_different_sizes_are_refused():
    truth = list(read_calibration(CALIB).cameras.values())
    with pytest.raises(CalibrationError, match="3 or more"):
        align_rigs(truth[:3], truth)
