"""`npucam plan`: the released models' calibrated NPU2 times, the scheduler run on the jobs
detect would issue (checked against rates computed by hand for simple scenes), the CPU
side's detect thread (water-filling, the bottleneck named), split configs, --json, errors.

Scenes here are fixed with --people / --faces and models are not measured (measure=False),
so these tests need no detector and no timing; tests/bench/test_plan_accuracy.py compares
whole plans with paced runs, and the multicam test below measures the real detector's
scenes (at a fixed cost a frame)."""

from __future__ import annotations

import dataclasses
import json
import textwrap
import threading
from pathlib import Path

import pytest

from npu.models import npu2_work
from npu.sim_cost import NPU2
from pipeline.cli import main
from pipeline.config import load_config
from stages.commands.plan import PlanError, format_plan, make_plan, plan_json
from stages.planning import plan as plan_module
from stages.planning.npu import whole_loops
from stages.planning.plan import water_fill
from stages.planning.probe import probe_cameras


def write(tmp_path, detect: str, infer: str, cameras: int = 1, fps: float = 10.0) -> str:
    cams = "".join(
        f'[[cameras]]\nname = "c{i}"\nurl = "synthetic:?width=320&height=240&fps={fps}"\n'
        "staleness_ms = 12000\n\n"
        for i in range(cameras)
    )
    text = (
        cams
        + '[[stages]]\nkind = "capture"\n\n[[stages]]\nkind = "detect"\n'
        + textwrap.dedent(detect)
        + '\n[[stages]]\nkind = "infer"\nbackend = "sim"\n'
        + textwrap.dedent(infer)
    )
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return str(path)


POSE = """
face = "none"
pose_jobs_per_frame = 1
pose_retry_s = 9.0
"""
S2 = """
[stages.sapiens2]
enabled = true
synthetic = true
"""


def plan(path: str, **kw):
    return make_plan(path, measure=False, horizon_s=130.0, **kw)


def test_models_are_priced_at_their_released_models_npu2_time(tmp_path):
    infer = (
        S2
        + """
    [stages.adaface]
    enabled = true
    synthetic = true
    [stages.clip]
    enabled = true
    synthetic = true
    labels = ["a person"]
    [stages.sim]
    pace_as = { adaface = "ir18" }
    """
    )
    p = plan(write(tmp_path, POSE, infer), people=1)
    s2, face, clip = (p.costs[m] for m in ("sapiens2", "adaface", "clip"))
    assert s2.released == "sapiens2-0.4b" and s2.pass_s == pytest.approx(2.4, rel=0.05)
    assert face.released == "adaface-ir18" and face.pass_s == pytest.approx(0.2, rel=0.05)
    assert clip.released == "clip-vit-h-14" and clip.batch == 4
    vision = npu2_work("clip", "vit-h-14").passes["forward"]
    assert clip.pass_s == pytest.approx(NPU2.pass_s(vision))
    assert p.budget["needed"] == 6 + 16 + 8 and not p.budget["fits"]  # 30 > 16 slots
    p = plan(write(tmp_path, POSE, S2), people=1, variants={"sapiens2": "1b"})
    assert p.costs["sapiens2"].released == "sapiens2-1b" and p.costs["sapiens2"].pass_s > 6


def test_one_person_is_posed_once_a_pass(tmp_path):
    # one track: its next job goes with the first frame after its result (10 fps)
    p = plan(write(tmp_path, POSE, S2), people=1)
    per_pass = 2.4 + 0.1  # the pass, then up to one frame until the track's next job
    edge = 1 / 100  # one result more or less in the 100 s window
    assert 1 / per_pass - edge <= p.results["sapiens2"] <= 1 / 2.4 + edge
    assert p.npu_utilisation == pytest.approx(2.4 / (2.4 + 0.05), abs=0.03)
    assert not p.drops.get("sapiens2")  # nothing waits: nothing is dropped
    lo, hi = p.spread["sapiens2"]  # any 45 s: one pose every 2.4-2.5 s, give or take one
    assert lo <= p.results["sapiens2"] <= hi and hi - lo <= 2 / 45 + 1e-9
    assert p.cameras[0].pose_every_s == pytest.approx(1 / p.results["sapiens2"])


def test_four_people_on_two_cameras_share_a_saturated_npu(tmp_path):
    p = plan(write(tmp_path, POSE, S2, cameras=2), people=2)
    assert p.npu_utilisation > 0.97
    assert p.results["sapiens2"] == pytest.approx(1 / 2.4, rel=0.03)
    a, b = (c.results["sapiens2"] for c in p.cameras)
    assert a == pytest.approx(b, rel=0.15)  # per-camera fairness
    # each of the 4 people is posed every 4 passes
    assert p.cameras[0].pose_every_s == pytest.approx(4 * 2.4, rel=0.1)


def test_face_interval_limits_the_faces_asked(tmp_path):
    detect = """
    person = "none"
    face = "blazeface"
    face_interval_s = 1.0
    pose = false
    """
    infer = """
    [stages.adaface]
    enabled = true
    synthetic = true
    """
    p = plan(write(tmp_path, detect, infer), people=1, faces=1)
    # At 10 fps the interval is 10 frames: the plan's frames are jittered as a camera's are
    # (stages/planning/npu.py CAPTURE_JITTER_S), so the 10th frame meets it about half the
    # time and the 11th the rest: a face every 1.05 s, at 0.5 s each (IR-101, the synthetic
    # model's stand-in): about half the NPU.
    assert p.results["adaface"] == pytest.approx(1 / 1.05, rel=0.03)
    assert p.npu_utilisation == pytest.approx(0.5 / 1.05, abs=0.03)
    assert p.utilisation["npu"]["asked"] == pytest.approx(0.5 / 1.05, abs=0.03)
    assert "none: everything fits" in p.bottleneck


def test_clip_interval_and_partial_batches(tmp_path):
    detect = """
    face = "none"
    pose = false
    clip = "persons"
    clip_interval_s = 2.0
    clip_max_per_frame = 4
    """
    infer = """
    [stages.clip]
    enabled = true
    synthetic = true
    labels = ["a person"]
    """
    p = plan(write(tmp_path, detect, infer), people=2)
    # every 2 s (20 frames, or 21 when the 20th is a moment early: 2.05 s on average, as in
    # test_face_interval_limits_the_faces_asked) one frame's 2 crops: one pass of 4 slots
    # (half padding) each time
    assert p.results["clip"] == pytest.approx(2 / 2.05, rel=0.03)
    assert p.npu_utilisation == pytest.approx(p.costs["clip"].pass_s / 2.05, abs=0.02)


RIG = """
[[stages]]
kind = "rig3d"
rig = "yard"
cameras = ["east", "north", "west", "south"]
calibration = "{calib}"
pose_interval_ms = {interval}
max_people = 1
"""


def rig_config(tmp_path, interval_ms: float) -> str:
    """Four 5 fps cameras in a rig, posed one group (4 views, one person each) per interval."""
    path = Path(write(tmp_path, POSE, S2, cameras=4, fps=5.0))
    text = path.read_text()
    for i, name in enumerate(("east", "north", "west", "south")):
        text = text.replace(f'name = "c{i}"', f'name = "{name}"')
    calib = Path("tests/standin_rig/multicam-3d-calib.toml").resolve()
    path.write_text(text + RIG.format(calib=calib, interval=interval_ms))
    return str(path)


def test_a_rigs_cameras_are_posed_by_group(tmp_path):
    # one group every 12 s: 4 poses of 2.4 s, 9.6 s of the device's 12 s. Planned as four
    # free cameras instead, the one person of each would be posed back to back (saturated).
    p = plan(rig_config(tmp_path, 12000), people=2)
    assert p.results["sapiens2"] == pytest.approx(4 / 12, rel=0.03)
    assert p.npu_utilisation == pytest.approx(9.6 / 12, abs=0.03)
    assert not p.drops.get("sapiens2")  # the group fits: nothing waits past its deadline
    # a view each a group: 8-9 of them in the 100 s window, one more or less at its edges
    assert all(abs(c.results["sapiens2"] - 1 / 12) <= 2 / 100 for c in p.cameras)
    # a group every 3 s asks 9.6 s of every 3: the device is full and views are dropped
    p = plan(rig_config(tmp_path, 3000), people=2)
    assert p.npu_utilisation > 0.97 and p.results["sapiens2"] == pytest.approx(1 / 2.4, rel=0.05)
    assert sum(p.drops["sapiens2"].values()) == pytest.approx(4 / 3 - 1 / 2.4, rel=0.1)


def test_the_window_is_whole_loops_of_the_longest_scene():
    assert whole_loops(120.0, [50.0, 10.0]) == 150.0  # multicam-3d's 5 fps bikes.mp4
    assert whole_loops(120.0, [10.0, 4.0]) == 120.0
    assert whole_loops(120.0, []) == 120.0 and whole_loops(120.0, [0.0]) == 120.0
    assert whole_loops(120.0, [250.0]) == 250.0
    assert whole_loops(120.0, [400.0]) == 120.0  # more than tripled: left as it is
    p = make_plan("tests/standin_rig/multicam-3d.toml", frames=250, horizon_s=150.0)
    assert p.window_s == pytest.approx(150.0) and p.cameras[0].loop_s == pytest.approx(50.0)


def test_water_fill_shares_one_thread_max_min_fairly():
    offered = {"a": 25.0, "b": 30.0, "c": 10.0}
    cost = {"a": 0.02, "b": 0.02, "c": 0.02}
    assert water_fill(offered, cost, 2.0) == offered  # fits
    got = water_fill(offered, cost, 1.0)  # 50 frames/s of capacity for 65 offered
    assert got["c"] == pytest.approx(10.0)
    assert got["a"] == pytest.approx(20.0, rel=1e-3) and got["b"] == pytest.approx(20.0, rel=1e-3)
    assert sum(got[c] * cost[c] for c in got) == pytest.approx(1.0, rel=1e-3)


def test_plan_names_the_cpu_detector_on_the_4_camera_pose_config(monkeypatch):
    # The detect stage's cost is measured on this host, so whether 90 frames a second
    # overrun its one thread depends on the host: one dev VM measured 6.5 ms a frame, and
    # they fit. The scenes stay measured; their cost is set to 20 ms a frame (a chosen slow
    # host, 1.8 threads' worth), so the test checks the planner's naming, not this machine.
    measured: list[float] = []
    measure = plan_module.measure_scenes

    def slow_host(*args, **kwargs):
        scenes = measure(*args, **kwargs)
        measured.extend(sc.detect_s for sc in scenes.values())
        return {n: dataclasses.replace(sc, detect_s=0.020) for n, sc in scenes.items()}

    monkeypatch.setattr(plan_module, "measure_scenes", slow_host)
    p = make_plan("configs/multicam-pose.toml", frames=40, horizon_s=100.0)
    assert measured and all(s > 0 for s in measured)
    d = p.utilisation["detect"]
    assert d["asked"] > d["capacity"]  # it is the bottleneck: 90 frames a second asked
    assert p.bottleneck.startswith("CPU: the detect stage 'detect'"), p.bottleneck
    assert 0 < p.detect_drop < 1 and p.drops["detect"]["queue_full_per_s"] > 0
    assert p.results["sapiens2"] > 0 and all(c.fps > 0 for c in p.cameras)
    probed = {c.camera: (c.fps, c.fps_source) for c in p.cameras}
    assert probed["carphone"] == (pytest.approx(29.97, abs=0.01), "probed")  # the file's fps
    assert probed["bikes2"] == (10.0, "configured")


def fix_detect_cost(monkeypatch, seconds: float = 0.020) -> None:
    """The detector's measured cost a frame replaced by `seconds` (the chosen slow host of
    the test above), so a verdict about the detect stage is the planner's, not this host's."""
    measure = plan_module.measure_scenes
    monkeypatch.setattr(
        plan_module,
        "measure_scenes",
        lambda *a, **kw: {
            n: dataclasses.replace(sc, detect_s=seconds) for n, sc in measure(*a, **kw).items()
        },
    )


def test_a_detector_that_keeps_up_is_not_the_bottleneck(tmp_path, monkeypatch):
    fix_detect_cost(monkeypatch)
    path = tmp_path / "one.toml"
    text = Path("configs/multicam-pose.toml").read_text()
    head, _, rest = text.partition('[[cameras]]\nname = "carphone"')
    rest = rest[rest.index("[[stages]]") :]
    one = head.replace('url = "sample:bikes.mp4"\n', 'url = "sample:bikes.mp4"\nfps = 2\n')
    path.write_text(one.replace("../.cache", str(Path.cwd() / ".cache")) + rest)
    p = make_plan(str(path), frames=40, horizon_s=100.0)
    assert not p.bottleneck.startswith("CPU: the detect stage"), p.bottleneck
    assert p.detect_drop == 0.0


def test_split_configs_plan_the_side_they_are(tmp_path):
    capture = make_plan("configs/split-capture.toml", frames=20)
    assert not capture.costs and "no infer stage" in " ".join(capture.notes)
    assert capture.utilisation["cpu"]["push"] > 0  # JPEG encoding for the PUSH sockets
    infer = make_plan("configs/split-infer.toml", probe_timeout_s=0.5)
    assert {c.kind for c in infer.cameras} == {"zmq"}  # the frames arrive over ZeroMQ
    assert set(infer.costs) == {"sapiens2", "adaface", "clip"}  # and the NPU runs here
    assert all(c.fps_source == "assumed (--fps)" for c in infer.cameras)


def test_live_cameras_are_probed_at_the_same_time(monkeypatch):
    # split-infer's two zmq: cameras. Each source's open waits at a barrier of two: probed
    # one after the other, the first would wait there alone and break it (order, not speed)
    import stages.sources

    barrier = threading.Barrier(2)
    met: list[str] = []

    class Meeting:
        def __init__(self, spec, stop):
            self.name = spec.name

        def open(self):
            barrier.wait(timeout=10)  # a hang guard only: the other probe is already reading
            met.append(self.name)

        def read(self, seq):
            return None

        def close(self):
            pass

    monkeypatch.setattr(stages.sources, "make_source", Meeting)
    config = load_config("configs/split-infer.toml")
    probes = probe_cameras(config, 10.0, 250, 1.0)
    assert sorted(met) == sorted(c.name for c in config.cameras) and not barrier.broken
    assert [p.kind for p in probes] == ["zmq", "zmq"]
    assert all(p.note.startswith("not reachable: fewer than 3 frames") for p in probes)


def test_cli_prints_the_plan_and_json(tmp_path, capsys, monkeypatch):
    fix_detect_cost(monkeypatch)  # 10 fps at 20 ms a frame: detect keeps up on any host
    path = write(tmp_path, POSE, S2)
    assert main(["plan", path, "--people", "2", "--frames", "4", "--horizon", "60"]) == 0
    text = capsys.readouterr().out
    assert "sapiens2     2.400 s a pass of 1 (calibrated NPU2 time of sapiens2-0.4b" in text
    assert "bottleneck: NPU: mostly sapiens2 as sapiens2-0.4b (asks" in text  # 100% busy
    assert "sustainable per camera:" in text and "c0: detect keeps up with" in text
    assert main(["plan", path, "--people", "1", "--frames", "4", "--horizon", "60", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["costs"]["sapiens2"]["released"] == "sapiens2-0.4b"
    assert 0.9 < data["npu_utilisation"] <= 1.0 and data["results"]["sapiens2"] > 0.3


def test_bad_input_is_a_named_error(tmp_path, capsys):
    path = write(tmp_path, POSE, S2)
    with pytest.raises(PlanError, match="--cost/--as yolo: not an enabled model"):
        plan(path, overrides={"yolo": 1.0})
    (tmp_path / "none.toml").write_text('[[stages]]\nkind = "capture"\n')
    with pytest.raises(PlanError, match=r"no \[\[cameras\]\]"):
        plan(str(tmp_path / "none.toml"))
    npu = path.replace("plan.toml", "npu.toml")
    text = Path(path).read_text().replace('backend = "sim"', 'backend = "npu"')
    (tmp_path / "npu.toml").write_text(text.replace("synthetic = true", 'bundle = "missing"'))
    with pytest.raises(PlanError, match="no calibrated NPU2 time"):
        plan(npu, people=1)
    with pytest.raises(SystemExit):
        main(["plan", path, "--cost", "sapiens2=-1"])
    assert "expected MODEL=SECONDS" in capsys.readouterr().err
    for horizon in (30.0, 10.0):  # the warm-up takes the first 30 s (it divided by zero)
        with pytest.raises(PlanError, match=f"--horizon {horizon:g} s leaves nothing after"):
            make_plan(path, measure=False, horizon_s=horizon, people=1)


def test_finding_9_the_plan_shows_each_models_contexts_and_whose_loads_evicted_them(tmp_path):
    """The planned run's scheduler keeps each model's share of the context budget (issue 13,
    finding 9): with 8 slots, Sapiens2 0.4b (6 contexts) and CLIP ViT-H/14 (8), which the
    synthetic stand-ins are planned as, cannot both stay resident, so each one's loads evict
    the other's, and the plan says so per model, in its text and its JSON."""
    infer = (
        "context_slots = 8\n"
        + S2
        + """
    [stages.clip]
    enabled = true
    synthetic = true
    labels = ["a person"]
    """
    )
    detect = POSE + 'clip = "frame"\nclip_interval_s = 1.0\n'
    p = plan(write(tmp_path, detect, infer), people=1)
    assert p.budget["slots"] == 8 and not p.budget["fits"]
    pose, clip = p.contexts["sapiens2"], p.contexts["clip"]
    assert (len(pose.contexts), len(clip.contexts)) == (6, 8)
    assert pose.evicted.get("clip", 0) > 0 and clip.evicted.get("sapiens2", 0) > 0
    assert pose.loads > 6 and clip.loads > 8  # reloaded, not loaded once
    text = format_plan(p)
    assert f"    sapiens2: {pose.resident} of 6 resident at the end, {pose.loads} loads" in text
    assert f"its contexts evicted: {pose.evicted['clip']} by clip" in text
    data = plan_json(p)
    assert data["contexts"]["clip"]["evicted"]["sapiens2"] == clip.evicted["sapiens2"]


def test_the_plan_prices_the_per_frame_pose_and_what_the_detect_thread_fits(monkeypatch):
    # a chosen host: detect 30 ms a frame of which 20 ms is one person's landmark models
    measure = plan_module.measure_scenes
    monkeypatch.setattr(
        plan_module,
        "measure_scenes",
        lambda *a, **kw: {
            n: dataclasses.replace(sc, detect_s=0.030, live_person_s=0.020, live_people=1.0)
            for n, sc in measure(*a, **kw).items()
        },
    )
    p = make_plan("configs/demo.toml", frames=8, horizon_s=60.0)
    assert [c.live_ms_per_person for c in p.cameras] == [20.0, 20.0]
    text = format_plan(p)
    assert "per-frame pose: 1.00 people followed a frame, 20.0 ms a person-frame" in text
    assert "the rest of detect 10.0 ms a frame" in text
    fps = sum(c.fps for c in p.cameras)
    fits = (p.utilisation["detect"]["capacity"] - fps * 0.010) / 0.020
    assert f"fits {fits:.1f} person-frames/s after detect's other work" in text
    assert f"the cameras ask {fps:.1f} ({fps:.1f} frames/s" in text
    assert "what goes first: whole frames" in text
    assert "person blazepose + the per-frame landmark models" in p.bottleneck
    assert plan_json(p)["cameras"][0]["live_ms_per_person"] == 20.0


def test_detect_workers_share_the_cores_with_each_camera_on_one_worker(tmp_path, monkeypatch):
    # a chosen host: 25 ms a frame on both demo cameras (25 and 30 fps): 1.37 threads' worth
    fix_detect_cost(monkeypatch, 0.025)
    text = Path("configs/demo.toml").read_text().replace("../", f"{Path.cwd()}/")
    plans = {}
    for workers in (1, 2):
        path = tmp_path / f"w{workers}.toml"
        path.write_text(
            text.replace('face_in = "persons"', f'face_in = "persons"\nworkers = {workers}')
        )
        plans[workers] = make_plan(str(path), frames=8, horizon_s=60.0)
    one, two = plans[1], plans[2]
    assert one.utilisation["detect"]["workers"] == 1 and two.utilisation["detect"]["workers"] == 2
    assert one.detect_drop > 0.2  # one thread cannot take 1.37 cores of frames
    # two workers, one camera each, each camera 0.62-0.75 of a core: fits what the cores leave
    per_worker = two.utilisation["detect"]["capacity"] / 2
    for c in two.cameras:
        expect = min(c.fps, per_worker / 0.025)
        assert c.detect_fps == pytest.approx(expect, rel=0.02), c
    assert "  detect's 2 workers: " in format_plan(two)
    assert "  detect thread: " in format_plan(one) and "one worker thread" in one.bottleneck
