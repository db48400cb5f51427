"""The .mot export: read back by a reader written from OpenSim's Storage format (header keys
up to `endheader`, a label row, tab-separated rows), its angle columns are the bone-frame
rotation vectors the synthetic walk was built from, its root columns the pose's translation
and rotation in the .trc files' Y-up axes."""

from __future__ import annotations

import numpy as np
import pytest
from body_scenes import FPS, walk_and_wave
from scipy.spatial.transform import Rotation

from stages.body.exports.mot import MotError, format_mot, write_mot


def read_storage(path) -> tuple[str, dict[str, str], list[str], np.ndarray]:
    """OpenSim Storage (.mot / .sto): name, header keys, column labels, rows [nRows, nColumns]."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name, keys = lines[0], {}
    end = lines.index("endheader")
    for line in lines[1:end]:
        key, sep, value = line.partition("=")
        if sep:
            keys[key.strip()] = value.strip()
    labels = lines[end + 1].split("\t")
    rows = np.array([[float(x) for x in line.split("\t")] for line in lines[end + 2 :]])
    assert rows.shape == (int(keys["nRows"]), int(keys["nColumns"])) == (rows.shape[0], len(labels))
    return name, keys, labels, rows


def test_the_mot_columns_are_the_walks_joint_angles_and_root_pose(body_model, tmp_path):
    truth = walk_and_wave(body_model, 12)
    rotations = np.stack([p.rotations for p in truth])
    translation = np.stack([p.translation for p in truth])
    times = 100.0 + np.arange(12) / FPS
    write_mot(tmp_path / "walk.mot", body_model, times, rotations, translation)

    name, keys, labels, rows = read_storage(tmp_path / "walk.mot")
    assert name == "walk" and keys["version"] == "1" and keys["inDegrees"] == "yes"
    assert labels[0] == "time"
    np.testing.assert_allclose(rows[:, 0], np.arange(12) / FPS, atol=1e-8)
    col = {label: rows[:, i] for i, label in enumerate(labels)}
    # walk_and_wave: the right knee flexes 0.15 + 0.5 (1 + cos(gait + 0.8)) / 2 rad about x
    gait = 2 * np.pi * (np.arange(12) / FPS) / 1.1
    knee = np.degrees(0.15 + 0.5 * (1 + np.cos(gait + 0.8)) / 2)
    np.testing.assert_allclose(col["lowerleg01_R_x"], knee, atol=1e-6)
    np.testing.assert_allclose(col["lowerleg01_R_y"], 0.0, atol=1e-6)
    np.testing.assert_allclose(col["upperarm01_R_z"], np.degrees(-1.9), atol=1e-6)
    np.testing.assert_allclose(col["upperarm01_R_y"], np.degrees(0.4), atol=1e-6)
    # root: position (y, z, x) of the Z-up world, turned 90 degrees about the world's up
    np.testing.assert_allclose(
        np.stack([col["root_tx"], col["root_ty"], col["root_tz"]], 1),
        translation[:, [1, 2, 0]],
        atol=1e-7,
    )
    turn = np.stack([col["root_rx"], col["root_ry"], col["root_rz"]], 1)
    np.testing.assert_allclose(turn, [[0.0, 90.0, 0.0]] * 12, atol=1e-6)  # Y is up
    assert Rotation.from_rotvec(np.radians(turn[0])).magnitude() == pytest.approx(np.pi / 2)


def test_bad_mot_inputs_name_what_is_wrong(body_model, tmp_path):
    with pytest.raises(MotError, match="increasing"):
        format_mot(np.array([0.0, 0.0]), ["a"], np.zeros((2, 1)))
    with pytest.raises(MotError, match=r"values must be \[T=2, 2\]"):
        format_mot(np.array([0.0, 0.1]), ["a", "b"], np.zeros((2, 1)))
    with pytest.raises(MotError, match="whitespace"):
        format_mot(np.array([0.0, 0.1]), ["a b"], np.zeros((2, 1)))
    with pytest.raises(MotError, match=r"rotations must be \[T, 104, 3, 3\]"):
        write_mot(tmp_path / "x.mot", body_model, [0.0], np.zeros((1, 3, 3)), np.zeros((1, 3)))
    with pytest.raises(MotError, match="cannot write"):
        write_mot(tmp_path / "no" / "x.mot", body_model, [0.0, 0.1],
                  np.tile(np.eye(3), (2, 104, 1, 1)), np.zeros((2, 3)))  # fmt: skip
