"""`npucam plan`: utilisation, drops and sustainable rates from per-item device times, checked
against hand-computed numbers; measured costs on sim are the simulator's modelled times."""

from __future__ import annotations

import textwrap

import pytest

from pipeline.cli import main
from stages.commands.plan import PlanError, format_plan, make_plan


def write_config(tmp_path, infer: str, cameras: str | None = None) -> str:
    cams = cameras or textwrap.dedent(
        """
        [[cameras]]
        name = "a"
        url = "a.mp4"
        fps = 10.0

        [[cameras]]
        name = "b"
        url = "b.mp4"
        fps = 5.0
        staleness_ms = 1000.0
        """
    )
    path = tmp_path / "plan.toml"
    path.write_text(cams + '\n[[stages]]\nkind = "infer"\n' + textwrap.dedent(infer))
    return str(path)


COSTED = """
backend = "sim"
[stages.sapiens2]
enabled = true
synthetic = true
cost_s = 0.6
[stages.adaface]
enabled = true
synthetic = true
cost_s = 0.02
[stages.clip]
enabled = true
synthetic = true
labels = ["a person"]
cost_s = 0.4
"""


def test_utilisation_from_configured_costs(tmp_path):
    plan = make_plan(write_config(tmp_path, COSTED), people=1, faces=2, clips=1, measure=False)
    a, b = plan.cameras
    # per frame: 1 x 0.6 + 2 x 0.02 + 1 x 0.4 / 4 = 0.74 device-s
    assert a.demand_s == pytest.approx(7.4) and b.demand_s == pytest.approx(3.7)
    assert plan.utilisation == pytest.approx(11.1)
    assert plan.dropped_share == pytest.approx(1 - 1 / 11.1)
    assert a.max_fps == pytest.approx(10 / 11.1) and b.max_fps == pytest.approx(5 / 11.1)
    # camera a's half of the device, less 10 fps of faces and CLIP, over 10 x 0.6 s a person
    assert a.max_people == pytest.approx((0.5 - 10 * 0.14) / 6.0 if 0.5 > 1.4 else 0.0)
    assert b.max_people == pytest.approx((0.5 - 5 * 0.14) / 3.0 if 0.5 > 0.7 else 0.0)
    # a 0.6 s pose pass outlasts camera a's default 0.5 s budget, not b's 1 s
    assert a.too_slow == ("sapiens2",) and b.too_slow == ()


def test_a_plan_that_fits(tmp_path):
    plan = make_plan(
        write_config(tmp_path, COSTED),
        people=0.1,
        faces=0.5,
        clips=0.2,
        overrides={"sapiens2": 0.05},
        measure=False,
    )
    per_frame = 0.1 * 0.05 + 0.5 * 0.02 + 0.2 * 0.1
    assert plan.utilisation == pytest.approx(15 * per_frame)
    assert plan.dropped_share == 0.0
    assert plan.costs["sapiens2"].source == "--cost"
    assert plan.cameras[0].max_people == pytest.approx((0.5 - 10 * 0.03) / (10 * 0.05))


def test_measured_on_sim_is_simulated_time(tmp_path):
    infer = f"""
    backend = "sim"
    synthetic_cache = "{tmp_path / "cache"}"
    [stages.sim]
    registry_dir = "{tmp_path / "hwctx"}"
    dispatch_s = 0.004
    [stages.clip]
    enabled = true
    synthetic = true
    labels = ["a person"]
    """
    plan = make_plan(write_config(tmp_path, infer), clips=2)
    cost = plan.costs["clip"]
    assert cost.batch == 4 and "measured on sim (simulated, synthetic)" in cost.source
    # every dispatch is modelled at >= 4 ms: the vision pass has one per GEMM chunk and MHA
    assert cost.pass_s >= 0.004 * 5
    assert plan.cameras[0].demand_s == pytest.approx(10 * 2 * cost.pass_s / 4)


def test_cli_prints_the_plan(tmp_path, capsys):
    assert main(["plan", write_config(tmp_path, COSTED), "--people", "2", "--no-measure"]) == 0
    text = capsys.readouterr().out
    assert "device utilisation asked: 2010.0%" in text  # (2*.6+2*.02+.1) x 15 fps
    assert "over capacity: about 95.0% of the asked work will be dropped" in text
    assert "WARNING a: a sapiens2 pass (0.600 s) outlasts" in text


def test_bad_input_is_a_named_error(tmp_path, capsys):
    no_cost = COSTED.replace("cost_s = 0.6\n", "")
    with pytest.raises(PlanError, match="no device time for sapiens2"):
        make_plan(write_config(tmp_path, no_cost), measure=False)
    with pytest.raises(PlanError, match="--cost yolo: not an enabled model"):
        make_plan(write_config(tmp_path, COSTED), overrides={"yolo": 1.0}, measure=False)
    with pytest.raises(PlanError, match="no \\[\\[cameras\\]\\]"):
        make_plan(write_config(tmp_path, COSTED, cameras="\n"), measure=False)
    with pytest.raises(SystemExit):
        main(["plan", write_config(tmp_path, COSTED), "--cost", "sapiens2=-1"])
    assert "expected MODEL=SECONDS" in capsys.readouterr().err


def test_finding_9_a_measured_plan_shows_each_models_contexts_and_what_evicts_what(tmp_path):
    """Loaded models report their hardware contexts and the device's measured cost of a
    load; with a 4-slot budget the two models may not both stay resident, and then the
    plan says whose contexts each one's pass evicts."""
    infer = f"""
    backend = "sim"
    synthetic_cache = "{tmp_path / "cache"}"
    context_slots = 4
    [stages.sim]
    registry_dir = "{tmp_path / "hwctx"}"
    [stages.sapiens2]
    enabled = true
    synthetic = true
    [stages.clip]
    enabled = true
    synthetic = true
    labels = ["a person"]
    """
    plan = make_plan(write_config(tmp_path, infer), clips=1)
    pose, clip = plan.contexts["sapiens2"], plan.contexts["clip"]
    assert plan.context_slots == 4
    # as the synthetic bundles declare them (Sapiens2: one xclbin per GEMM K and the mha's)
    assert (pose.contexts, clip.contexts) == (3, 3)
    assert pose.load_s == pytest.approx(0.03) and clip.load_s == pytest.approx(0.03)  # the sim's
    assert (pose.reloads, pose.evicts, clip.reloads, clip.evicts) == (2, {"clip": 2}, 2,
                                                                      {"sapiens2": 2})  # fmt: skip
    text = format_plan(plan)
    assert "hardware contexts (4 slots; models loaded to measure):" in text
    assert "together 6 > 4: one pass of each in turn, once warm, reloads" in text
    assert "    sapiens2: 2 contexts (60.0 ms), evicting 2 of clip's" in text
