"""The plan prices each body stage: its rig's groups a second (its slowest camera, at most
one per pose_interval_ms) times the rig's people times bench/body_fit.py's cost a
person-frame, on its one thread; `npucam plan` adds it to the CPU and says how."""

from __future__ import annotations

import textwrap

import pytest

from pipeline.config import parse_config
from stages.commands.plan import format_plan, make_plan
from stages.planning.body import BODY_FIT_FINGERS_S, BODY_FIT_S, body_loads


def _config(tmp_path, interval_ms: float = 0.0, fingers: bool = False):
    data = {
        "cameras": [{"name": n, "url": "synthetic:"} for n in ("a", "b", "c")],
        "stages": [
            {"kind": "capture"},
            {"kind": "rig3d", "rig": "hall", "cameras": ["a", "b"], "calibration": "x.toml",
             "pose_interval_ms": interval_ms},
            {"kind": "body", "name": "fit", "rig": "hall", "fingers": fingers},
            {"kind": "body", "name": "lost", "rig": "nowhere"},
        ],
    }  # fmt: skip
    return parse_config(data, tmp_path / "run.toml")


def test_a_body_stage_asks_groups_times_people_times_the_benched_cost(tmp_path):
    rates = {"a": 10.0, "b": 8.0, "c": 30.0}
    people = {"a": 2.0, "b": 1.0, "c": 9.0}
    (load,) = body_loads(_config(tmp_path), rates, people)  # the rig-less stage has none
    assert (load.stage, load.rig, load.groups_per_s, load.people) == ("fit", "hall", 8.0, 1.5)
    assert load.asked == pytest.approx(8.0 * 1.5 * BODY_FIT_S)
    (paced,) = body_loads(_config(tmp_path, interval_ms=250.0), rates, people)
    assert paced.groups_per_s == 4.0
    fingers = _config(tmp_path, fingers=True)
    assert body_loads(fingers, rates, people)[0].asked == pytest.approx(
        8 * 1.5 * BODY_FIT_FINGERS_S
    )
    crowded = body_loads(_config(tmp_path), rates, {"a": 200.0, "b": 200.0})[0]
    assert crowded.asked > 1.0 and crowded.predicted == 1.0  # one thread: at most a core


def test_the_plan_of_a_config_with_a_body_stage_shows_its_cpu(tmp_path):
    path = tmp_path / "body.toml"
    cams = "".join(
        f'[[cameras]]\nname = "{n}"\nurl = "synthetic:?width=320&height=240&fps=20"\n\n'
        for n in ("a", "b")
    )
    path.write_text(cams + textwrap.dedent(
        """
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "detect"
        face = "none"
        [[stages]]
        kind = "rig3d"
        rig = "hall"
        cameras = ["a", "b"]
        calibration = "x.toml"
        [[stages]]
        kind = "body"
        rig = "hall"
        """
    ))  # fmt: skip
    plan = make_plan(str(path), people=2.0, frames=4, measure=False)
    cpu = plan.utilisation["cpu"]
    # detect is not measured (0 s a frame): both cameras' 20 frames a second reach the rig
    assert cpu["body"] == pytest.approx(20.0 * 2.0 * BODY_FIT_S)
    assert cpu["asked"] * cpu["cores"] >= cpu["body"]
    text = format_plan(plan)
    assert f"body fit {cpu['body']:.2f} cores" in text
    assert "bench/body_fit.py" in text
