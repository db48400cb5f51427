"""A rig's camera clocks (issue 33, finding 1): the rig grouped by capture time and counted a
frame late when it was captured before the last released group, so one frame of one camera
stamped 8 s ahead opened a group of its own, which timed out and was released: every camera's
frames were then late for 8 s; a camera whose clock ran 1 s ahead stopped complete groups for
good. Now each camera's clock is checked against the rig's from arrival times
(stages/rig/sync.py): a frame stamped ahead of its own camera's recent frames is refused, a
camera whose clock is off beyond the wait has its times corrected and is reported with its
offset (the rig3d stage's info and gauges on `stats`, a log line), and the others never stop.
Everything runs on an injected clock (the arrival time).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages" / "rig"))

from rig_scenes import ring_cameras  # noqa: E402

from pipeline.config import parse_config  # noqa: E402
from pipeline.graph import Context, check_stages  # noqa: E402
from pipeline.messages import now_ns  # noqa: E402
from pipeline.metrics import Metrics  # noqa: E402
from pipeline.queues import BoundedQueue  # noqa: E402
from stages.rig.calibration import Calibration, write_calibration  # noqa: E402
from stages.rig.groups import RigGroups, RigRegistry  # noqa: E402
from stages.rig.stage import Rig3D  # noqa: E402
from stages.rig.sync import FrameGroup  # noqa: E402

MS = 1_000_000
FPS = 30.0
CAMS = ("a", "b", "c")


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def play(
    seconds: float, stamp_error_ms, seed: int = 0
) -> tuple[RigGroups, list[FrameGroup], list[tuple[int, str, int, int]]]:
    """Three 30 fps cameras captured 5 ms apart, each frame arriving 0-15 ms after capture
    (in arrival order, on the injected clock); `stamp_error_ms(camera, seq)` is added to the
    capture time the camera stamps. Returns (the rig, released groups, frames as (arrival,
    camera, seq, true capture ns))."""
    rng = np.random.default_rng(seed)
    frames = []
    for v, cam in enumerate(CAMS):
        for seq in range(int(seconds * FPS)):
            true_ts = 10_000 * MS + round((5 * v + 1000 * seq / FPS) * MS)
            frames.append((true_ts + int(rng.uniform(0, 15) * MS), cam, seq, true_ts))
    frames.sort()
    clock = Clock()
    rig = RigGroups("hall", dict.fromkeys(CAMS, FPS), clock=clock)
    released: list[FrameGroup] = []
    grouper = rig.grouper
    for arrival, cam, seq, true_ts in frames:
        clock.now = arrival
        released += grouper.expire()
        _, closed = grouper.place(cam, seq, true_ts + round(stamp_error_ms(cam, seq) * MS))
        released += closed
    released += grouper.flush()
    return rig, released, frames


def instants_with(groups: list[FrameGroup], cameras: tuple[str, ...]) -> set[int]:
    """The seqs (one instant each) of the groups holding those cameras' frames of one seq."""
    out = set()
    for g in groups:
        seqs = {g.views[c].seq for c in cameras if c in g.views}
        if all(c in g.views for c in cameras) and len(seqs) == 1:
            out |= seqs
    return out


def test_one_frame_stamped_8_s_ahead_is_refused_and_stalls_nobody():
    rig, groups, _ = play(5.0, lambda cam, seq: 8000.0 if (cam, seq) == ("b", 30) else 0.0)
    # every instant of the others, and of b except the frame it stamped wrong, groups whole
    assert instants_with(groups, ("a", "c")) == set(range(150))
    assert instants_with(groups, CAMS) == set(range(150)) - {30}
    assert rig.grouper.late == 0
    assert rig.grouper.clocks.outliers == {"a": 0, "b": 1, "c": 0}
    assert rig.gauges()["clock_outliers"] == 1


def test_a_camera_whose_clock_runs_1_s_ahead_is_corrected_and_reported():
    rig, groups, _ = play(5.0, lambda cam, seq: 1000.0 if cam == "b" else 0.0)
    whole = instants_with(groups, CAMS)
    # a few frames go before b is judged (8 frames each) and its views move to its
    # corrected time; after that every instant groups whole, at the true instant's skew
    assert set(range(20, 150)) <= whole, sorted(set(range(150)) - whole)
    assert instants_with(groups, ("a", "c")) >= set(range(20, 150))
    tol = rig.grouper.tolerance_ns
    assert all(g.skew_ns <= tol for g in groups)
    offsets = rig.grouper.offsets()
    assert abs(offsets["b"] - 1000 * MS) <= 15 * MS, offsets
    assert abs(offsets["a"]) <= 15 * MS and abs(offsets["c"]) <= 15 * MS, offsets
    gauges = rig.gauges()
    assert gauges["clock_corrected_cameras"] == 1
    assert 985 <= gauges["clock_offset_max_ms"] <= 1015
    report = rig.clock_report()
    assert report["b"].startswith("corrected, clock +") and report["a"].startswith("in step")


def test_a_clock_that_steps_1_s_ahead_mid_run_never_stops_the_others():
    rig, groups, _ = play(6.0, lambda cam, seq: 1000.0 if cam == "b" and seq >= 60 else 0.0)
    assert instants_with(groups, ("a", "c")) == set(range(180))
    whole = instants_with(groups, CAMS)
    # b's frames are refused as stamped ahead until its baseline moves, then corrected
    assert set(range(60)) <= whole and set(range(90, 180)) <= whole
    assert rig.grouper.late == 0
    assert 1 <= rig.grouper.clocks.outliers["b"] <= 10


def test_a_clock_40_ms_ahead_within_the_wait_still_groups_every_instant():
    rig, groups, _ = play(5.0, lambda cam, seq: 40.0 if cam == "b" else 0.0)
    # within the wait (66.7 ms) the stamps are trusted: b's frames group with the others'
    # frames stamped at the same time, and nothing is refused or late
    assert instants_with(groups, ("a", "c")) == set(range(150))
    assert sum(not g.missing for g in groups) >= 145
    assert rig.grouper.late == 0 and rig.gauges()["clock_corrected_cameras"] == 0


def test_the_rig3d_stage_reports_a_corrected_camera_on_stats_and_logs_it(tmp_path, caplog):
    """Through the rig3d stage: the stats snapshot carries each camera's clock (the stage's
    info `clock_<camera>`) and its gauges, and the change to `corrected` is logged once."""
    names = ("cam0", "cam1", "cam2")
    cams = ring_cameras(np.random.default_rng(0), n=3)
    write_calibration(
        tmp_path / "Calib.toml", Calibration({f"cam_{i + 1:02d}": c for i, c in enumerate(cams)})
    )
    config = parse_config(
        {
            "cameras": [{"name": n, "url": "synthetic:", "fps": 10.0} for n in names],
            "stages": [
                {"kind": "capture"},
                {"kind": "detect", "person": "none", "face": "none"},
                {"kind": "rig3d", "rig": "hall", "cameras": list(names),
                 "calibration": "Calib.toml", "wait_ms": 200.0},
            ],
        },
        tmp_path / "rig.toml",
    )  # fmt: skip
    (_, _, (_, opts)) = check_stages(config)

    async def main():
        metrics = Metrics()
        context = Context(config, metrics)
        stage = Rig3D("rig3d", opts, context)
        groups = RigRegistry.of(context).of_camera("cam0")
        arrival = [0]
        groups.grouper.clock = lambda: arrival[0]
        inbox = BoundedQueue("rig3d", 100, "block", metrics)
        inbox.add_producer()

        class Sink:
            async def send(self, item) -> None:
                pass

        task = asyncio.create_task(stage.run(inbox, Sink()))
        base = now_ns()
        for step in range(20):
            for v, name in enumerate(names):
                true_ts = base + step * 100 * MS + v * 3 * MS
                arrival[0] = true_ts + 10 * MS
                ahead = 1000 * MS if name == "cam1" else 0
                groups.place(name, step, true_ts + ahead, true_ts + 5000 * MS, cams[v].size)
                groups.posed(name, step, [])
        await asyncio.sleep(0.2)  # a few of the stage's polls
        whole = metrics.snapshot()
        scraped = {
            s.labels["camera"]: s.value
            for fam in metrics.prometheus_collector().collect()
            if fam.name == "npucam_camera_clock_offset_ms"
            for s in fam.samples
        }
        inbox.producer_done()
        await task
        return whole, scraped

    with caplog.at_level(logging.WARNING, logger="stages.rig.stage"):
        whole, scraped = asyncio.run(main())
    snapshot = whole["stages"]["rig3d"]
    # the cameras' health entries carry the clock too (the issue: "stats and health")
    health = whole["cameras"]
    assert health["cam1"]["clock"] == "corrected"
    assert health["cam1"]["clock_offset_ms"] == pytest.approx(1000.0, abs=1.0)
    assert health["cam0"]["clock"] == "in step"
    assert abs(health["cam0"]["clock_offset_ms"]) < 5.0
    assert scraped["cam1"] == pytest.approx(1000.0, abs=1.0)
    assert snapshot["info"]["clock_cam1"].startswith("corrected, clock +1000.0 ms")
    assert snapshot["info"]["clock_cam0"].startswith("in step")
    assert snapshot["gauges"]["clock_corrected_cameras"] == 1
    logged = [r.getMessage() for r in caplog.records if "'cam1': corrected" in r.getMessage()]
    assert len(logged) == 1
