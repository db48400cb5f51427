"""stages/planning/rig_rate.py: a live rig's pose3d rate is its slowest camera's processed frame
rate, at most its capture rate, thinned by pose_interval_ms; read from a config's rig3d stages."""

from __future__ import annotations

import pytest

from pipeline.config import load_config
from stages.planning.npu import PlanError
from stages.planning.rig_rate import live_rig_rates, rig_rate

CAMS = ["a", "b", "c"]


def test_a_rig_whose_cameras_detect_keeps_up_with_runs_at_its_slowest_cameras_rate():
    r = rig_rate("lab", CAMS, {"a": 5, "b": 5, "c": 4}, {"a": 5, "b": 5, "c": 4})
    assert (r.groups_per_s, r.limited_by, r.capture_fps, r.detect_fps) == (4, "cameras", 4, 4)


def test_detect_falling_behind_on_one_camera_limits_the_rig():
    r = rig_rate("lab", CAMS, {"a": 5, "b": 5, "c": 5}, {"a": 5, "b": 1.25, "c": 5})
    assert (r.groups_per_s, r.limited_by) == (1.25, "detect")
    # a rig camera detect does not process: no group is ever posed
    assert rig_rate("lab", CAMS, {"a": 5, "b": 5, "c": 5}, {"a": 5, "b": 5}).groups_per_s == 0


def test_pose_interval_thins_the_groups():
    r = rig_rate("lab", CAMS, dict.fromkeys(CAMS, 5.0), dict.fromkeys(CAMS, 5.0), 500.0)
    assert (r.groups_per_s, r.limited_by) == (2.0, "pose_interval_ms")


def test_only_live_rigs_of_a_config_are_rated():
    rigs = live_rig_rates(
        load_config("configs/studio-3d-multi.toml"),
        {f"cam0{i}": 3.0 for i in range(1, 5)},
        {"cam01": 3.0, "cam02": 3.0, "cam03": 2.4, "cam04": 3.0},
    )
    assert [(r.rig, r.groups_per_s, r.limited_by) for r in rigs] == [("lab", 2.4, "detect")]


def test_a_bad_rig3d_table_is_a_named_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n\n[[stages]]\nkind = "rig3d"\n'
        'rig = "r"\ncameras = ["a"]\ncalibration = "c.toml"\n'
    )
    with pytest.raises(PlanError, match=r"stages\[0\]: invalid rig3d options"):
        live_rig_rates(load_config(str(path)), {"a": 5.0}, {"a": 5.0})
