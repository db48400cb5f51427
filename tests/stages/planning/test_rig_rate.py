"""stages/planning/rig_rate.py: a live rig's pose3d rate from the fraction of each camera's frames
detect processes (independent views, Poisson-binomial), at its slowest camera's fps, thinned by
pose_interval_ms; read from a config's rig3d stages."""

from __future__ import annotations

import itertools
import math

import pytest

from pipeline.config import load_config
from stages.commands.plan import format_plan, make_plan, plan_json
from stages.planning.npu import PlanError
from stages.planning.rig_rate import live_rig_rates, rig_rate, views_at_least

CAMS = ["a", "b", "c", "d"]


def _enumerated(p: list[float], k: int) -> float:
    """P(at least k events) by summing every outcome: the reference for views_at_least."""
    return sum(
        math.prod(q if hit else 1 - q for q, hit in zip(p, outcome, strict=True))
        for outcome in itertools.product((0, 1), repeat=len(p))
        if sum(outcome) >= k
    )


def test_views_at_least_is_the_poisson_binomial_tail():
    p = [0.2, 0.5, 0.9, 0.35]
    for k in range(6):
        assert views_at_least(p, k) == pytest.approx(_enumerated(p, k), abs=1e-12)
    # four cameras each processed 0.85 of 3 fps: the studio-3d-multi run's p
    q = [0.85 / 3] * 4
    assert views_at_least(q, 1) == pytest.approx(1 - (1 - 0.85 / 3) ** 4)


def test_a_rig_whose_cameras_detect_keeps_up_with_has_every_view_of_every_group():
    r = rig_rate("lab", CAMS, dict.fromkeys(CAMS, 5.0), {"a": 5, "b": 5, "c": 5, "d": 5})
    assert (r.group_fps, r.messages_per_s, r.per_person_per_s) == (5.0, 5.0, 5.0)
    assert r.limited_by == "cameras"
    slow = rig_rate("lab", CAMS, {"a": 5, "b": 5, "c": 4, "d": 5}, {"a": 5, "b": 5, "c": 4, "d": 5})
    assert slow.group_fps == 4.0  # groups at the slowest camera's rate


def test_detect_keeping_half_of_each_cameras_frames():
    r = rig_rate("lab", CAMS, dict.fromkeys(CAMS, 4.0), dict.fromkeys(CAMS, 2.0))
    assert r.limited_by == "detect" and r.view_fraction == dict.fromkeys(CAMS, 0.5)
    assert r.messages_per_s == pytest.approx(4 * (1 - 0.5**4))  # 3.75: a group with a view
    assert r.per_person_per_s == pytest.approx(4 * (1 - 0.5**4 - 4 * 0.5**4))  # 2.75
    # a camera detect does not process: its view never comes
    r = rig_rate("lab", CAMS[:2], {"a": 5, "b": 5}, {"a": 5})
    assert (r.messages_per_s, r.per_person_per_s) == (5.0, 0.0)


def test_pose_interval_thins_the_groups():
    r = rig_rate("lab", CAMS, dict.fromkeys(CAMS, 5.0), dict.fromkeys(CAMS, 5.0), 500.0)
    assert (r.per_person_per_s, r.limited_by) == (2.0, "pose_interval_ms")


def test_only_live_rigs_of_a_config_are_rated():
    rigs = live_rig_rates(
        load_config("configs/studio-3d-multi.toml"),
        {f"cam0{i}": 3.0 for i in range(1, 5)},
        {"cam01": 3.0, "cam02": 3.0, "cam03": 1.5, "cam04": 3.0},
    )
    assert [(r.rig, r.group_fps, r.min_views, r.limited_by) for r in rigs] == [
        ("lab", 3.0, 2, "detect")
    ]
    assert rigs[0].per_person_per_s == pytest.approx(3.0)  # 3 full views: always 2+
    assert rigs[0].messages_per_s == pytest.approx(3.0)


def test_a_bad_rig3d_table_is_a_named_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n\n[[stages]]\nkind = "rig3d"\n'
        'rig = "r"\ncameras = ["a"]\ncalibration = "c.toml"\n'
    )
    with pytest.raises(PlanError, match=r"stages\[0\]: invalid rig3d options"):
        live_rig_rates(load_config(str(path)), {"a": 5.0}, {"a": 5.0})


def test_the_plan_reports_the_rig_rate_in_text_and_json():
    # detect not measured: it keeps up, so every view of every 1 fps group is there
    p = make_plan("configs/studio-3d-multi.toml", measure=False, frames=4, horizon_s=60.0)
    (r,) = p.rigs
    assert (r.rig, r.group_fps, r.per_person_per_s, r.limited_by) == ("lab", 1.0, 1.0, "cameras")
    text = format_plan(p)
    assert "  lab: 1.00 pose3d/s per person (seen by every camera, in 2+ views)" in text
    assert plan_json(p)["rigs"][0]["messages_per_s"] == 1.0
