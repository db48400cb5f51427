"""The .trc writer (stages/rig/trc.py) against the header Pose2Sim's make_trc builds
(Pose2Sim/triangulation.py), retyped in pose2sim_header below with its values: rates, frame
and marker counts, units 'm', OrigDataStartFrame / OrigNumFrames (Pose2Sim writes the frame
range it cut from the videos; a whole recording here: 1 and T), names joined by three tabs and
closed by two, X{i} Y{i} Z{i} after two tabs; and its zup2yup column order (y, z, x).
"""

from __future__ import annotations

import numpy as np
import pytest

from npu.models.sapiens2 import keypoints as keypoints308
from stages.rig.trc import TrcError, format_trc, write_trc


def pose2sim_header(name, rate, n_frames, names):
    return [
        "PathFileType\t4\t(X/Y/Z)\t" + name,
        "DataRate\tCameraRate\tNumFrames\tNumMarkers\tUnits\tOrigDataRate\tOrigDataStartFrame"
        "\tOrigNumFrames",
        "\t".join(map(str, [rate, rate, n_frames, len(names), "m", rate, 1, n_frames])),
        "Frame#\tTime\t" + "\t\t\t".join(names) + "\t\t",
        "\t\t" + "\t".join([f"X{i + 1}\tY{i + 1}\tZ{i + 1}" for i in range(len(names))]),
    ]


def test_trc_has_pose2sims_header_and_yup_rows(tmp_path):
    rng = np.random.default_rng(0)
    points = rng.uniform(-1, 2, (5, 3, 3))
    points[2, 1] = np.nan
    times = 10.0 + np.arange(5) / 30
    path = tmp_path / "walk.trc"
    write_trc(path, points, times, names=["nose", "left_eye", "right_eye"], rate=30.0)
    lines = path.read_text().split("\n")
    assert lines[:5] == pose2sim_header("walk.trc", 30.0, 5, ["nose", "left_eye", "right_eye"])
    rows = [line.split("\t") for line in lines[5:-1]]
    assert lines[-1] == "" and len(rows) == 5 and all(len(r) == 2 + 9 for r in rows)
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5]
    assert np.allclose([float(r[1]) for r in rows], times - 10.0, atol=1e-6)
    values = np.array([[float(v) if v else np.nan for v in r[2:]] for r in rows]).reshape(5, 3, 3)
    assert np.isnan(values[2, 1]).all() and rows[2][5:8] == ["", "", ""]
    assert np.allclose(values, points[..., [1, 2, 0]], atol=1e-6, equal_nan=True)


def test_default_markers_are_the_308_keypoints_and_rate_comes_from_times():
    text = format_trc(np.zeros((3, 308, 3)), np.array([0.0, 0.04, 0.08]))
    lines = text.split("\n")
    assert lines[3].split("\t\t\t")[0] == "Frame#\tTime\t" + keypoints308.NAMES[0]
    assert lines[2].split("\t")[:4] == ["25.0", "25.0", "3", "308"]


def test_bad_trajectories_are_refused():
    with pytest.raises(TrcError, match=r"points must be \[T, M=308, 3\]"):
        format_trc(np.zeros((3, 17, 3)), np.arange(3.0))
    with pytest.raises(TrcError, match="increasing seconds"):
        format_trc(np.zeros((3, 308, 3)), np.array([0.0, 0.0, 1.0]))
    with pytest.raises(TrcError, match="without tabs"):
        format_trc(np.zeros((1, 1, 3)), np.zeros(1), names=["a\tb"], rate=30)
    with pytest.raises(TrcError, match="give its rate"):
        format_trc(np.zeros((1, 308, 3)), np.zeros(1))
