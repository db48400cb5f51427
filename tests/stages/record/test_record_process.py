"""`npucam process`'s offline run (stages/record/process.py): the config's cameras read the
recording unpaced, every recorded frame reaches publish (nothing dropped), capture times keep
their recorded differences, the take is a replayable session written out as JSON lines, and a
config camera the session did not record is an error naming it."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import ConfigError
from stages.record import process
from stages.record.frame_log import FrameSegmentWriter, encode_jpeg
from tests.pacing import PACINGS, set_pacing

REPO = Path(__file__).resolve().parents[3]
MS = 1_000_000
T0 = 1_600_000_000 * 10**9


def _session(tmp_path, frames: int = 15, cameras: tuple[str, ...] = ("cam",)):
    """A recording of `cameras`, frame k of each captured at one instant (a synchronized
    capture's), 40 ms apart give or take a millisecond, in segments of 5 frames."""
    offsets = [i * 40 * MS + (i % 3) * MS for i in range(frames)]
    for camera in cameras:
        folder = tmp_path / "session" / "frames" / camera
        folder.mkdir(parents=True)
        for part in range(3):
            writer = FrameSegmentWriter(folder / f"{part + 1:06d}")
            for seq in range(part * 5, min(frames, part * 5 + 5)):
                image = np.full((48, 64, 3), seq * 10 % 256, np.uint8)
                writer.append(seq, T0 + offsets[seq], encode_jpeg(image, 90))
            writer.close()
    return tmp_path / "session", offsets


CONFIG = """
[[cameras]]
name = "cam"
url = "synthetic:"
fps = 5
[[stages]]
kind = "capture"
[[stages]]
kind = "publish"
bind = "tcp://127.0.0.1:5560"
inbox = { size = 1, policy = "latest" }
"""


def test_every_recorded_frame_is_processed_and_written_to_the_take(tmp_path, write_config):
    session, offsets = _session(tmp_path)
    path = write_config(CONFIG)
    out = tmp_path / "out"
    config = process.offline_config(path, session, out)
    code, summary, _ = asyncio.run(process.run_offline(config, io.StringIO()))
    assert code == 0
    lines = [json.loads(line) for line in (out / "2d" / "cam.jsonl").read_text().splitlines()]
    assert [line["seq"] for line in lines] == list(range(15))  # no frame dropped, in order
    # the recorded capture times, not the run's
    assert [line["capture_ts_ns"] - T0 for line in lines] == offsets
    assert [line["det"]["header"]["capture_ts_ns"] - T0 for line in lines] == offsets
    assert summary["frames_read"] == summary["frames_written"] == 15
    assert summary["drops"] == 0 and summary["complete"]
    assert json.loads((out / process.SUMMARY).read_text()) == summary


def test_the_configs_own_record_stages_are_left_out(tmp_path, write_config):
    session, _ = _session(tmp_path)
    text = CONFIG.replace('kind = "capture"', 'kind = "capture"\nto = ["publish", "rec"]')
    path = write_config(text + '[[stages]]\nkind = "record"\nname = "rec"\npath = "mine"\n')
    config = process.offline_config(path, session, tmp_path / "out")
    kinds = [(s.kind, s.name) for s in config.stages]
    assert kinds == [
        ("capture", None),
        ("publish", None),
        ("stages.record.take:Take", process.TAKER),
    ]
    assert config.stages[0].to == ["publish"]


def test_a_config_camera_the_session_did_not_record_is_an_error_naming_it(tmp_path, write_config):
    session, _ = _session(tmp_path)
    path = write_config(CONFIG.replace('name = "cam"', 'name = "door"'))
    with pytest.raises(ConfigError, match=r"cameras\[0\]: the session .* has no camera 'door'"):
        process.offline_config(path, session, tmp_path / "out")


def test_the_npucam_process_command_writes_the_take_and_its_json_lines(tmp_path, write_config):
    session, _ = _session(tmp_path)
    path = write_config(CONFIG)
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "pipeline", "process", str(session)]
        + ["--config", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "15/15 frames" in run.stderr
    lines = (out / "2d" / "cam.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(15))
    assert f"process: 15/15 frames in {out}, 0 persons posed, 0 dropped" in run.stdout


POSE_CONFIG = """
[[cameras]]
name = "cam"
url = "synthetic:"
[[stages]]
kind = "capture"
[[stages]]
kind = "detect"
person = "roi"
person_regions = [
  { name = "left", x = 2, y = 2, w = 24, h = 40 },
  { name = "right", x = 36, y = 4, w = 24, h = 40 },
]
face = "none"
pose_jobs_per_frame = 1    # live: one refresh a frame; the pass poses everyone regardless
to = ["publish", "infer"]
inbox = { size = 1, policy = "latest" }
[[stages]]
kind = "infer"
backend = "sim"
to = ["dark"]
[stages.sim]
pacing = "npu2"            # each pose takes Sapiens2 0.4b's modelled 2.4 s (tests/pacing.py)
[stages.sapiens2]
enabled = true
synthetic = true
[[stages]]
kind = "dark"
to = ["publish"]
[[stages]]
kind = "publish"
inbox = { size = 1, policy = "drop_oldest" }
"""


@pytest.mark.parametrize("pacing", PACINGS)
def test_the_pass_poses_every_tracked_person_on_every_frame(tmp_path, write_config, pacing):
    """Unpaced by default; at NPU2's pace (2.4 s a pose: the device sets the pass's pace, the
    recording is read as the pipeline takes it) in the slow variant (tests/pacing.py)."""
    session, _ = _session(tmp_path, frames=2)
    path = set_pacing(write_config(POSE_CONFIG), pacing)
    out = tmp_path / "out"
    config = process.offline_config(path, session, out)
    code, summary, _ = asyncio.run(process.run_offline(config, io.StringIO()))
    assert code == 0
    lines = [json.loads(line) for line in (out / "2d" / "cam.jsonl").read_text().splitlines()]
    assert [line["seq"] for line in lines] == [0, 1]
    for line in lines:
        tracked = line["det"]["header"]["track_ids"]
        assert len(tracked) == 2 and None not in tracked
        # a Sapiens2 pose of every tracked person, on this very frame
        assert [p["header"]["track_id"] for p in line["poses"]] == sorted(tracked)
        assert {p["header"]["seq"] for p in line["poses"]} == {line["seq"]}
        assert all(len(p["arrays"]["keypoints"]) == 308 for p in line["poses"])
    assert summary["persons_posed"] == 4 and summary["drops"] == 0


def _process(session: Path, config: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "process", str(session)]
        + ["--config", str(config), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


# The interrupted pass is interrupted once its first frame is written; each frame is two
# Sapiens2 poses. SIGKILL ends it there. SIGINT stops it gracefully: it drains what it has read
# for up to drain_timeout_s (3 s), which unpaced is every frame of a short recording, so that
# pass runs at NPU2's pace (2.4 s a pose), where the drain ends with frames unwritten.
@pytest.mark.parametrize(
    ("how", "frames", "pacing"),
    [(signal.SIGKILL, 8, "none"), pytest.param(signal.SIGINT, 4, "npu2", marks=pytest.mark.slow)],
)
def test_an_interrupted_pass_resumed_writes_the_take_an_uninterrupted_one_does(
    tmp_path, write_config, how, frames, pacing
):
    session, _ = _session(tmp_path, frames=frames)
    unpaced = set_pacing(write_config(POSE_CONFIG, "unpaced.toml"), "none")
    whole = tmp_path / "whole"
    code, _, _ = asyncio.run(
        process.run_offline(process.offline_config(unpaced, session, whole), io.StringIO())
    )
    assert code == 0
    path = set_pacing(write_config(POSE_CONFIG), pacing)
    out = tmp_path / "out"
    run = _process(session, path, out)
    checkpoint = out / "checkpoint.json"
    deadline = time.monotonic() + 240
    while not (checkpoint.exists() and json.loads(checkpoint.read_text())["cameras"]):
        assert run.poll() is None, f"the pass ended before it was interrupted: {run.stderr}"
        assert time.monotonic() < deadline, "no frame written in 240 s"
        time.sleep(0.01)
    run.send_signal(how)
    stdout, _ = run.communicate(timeout=120)
    assert run.returncode != 0  # killed, or stopped before the end
    if how == signal.SIGINT:  # it says so, and its summary does not call the take whole
        assert "(stopped before the end: run again to resume)" in stdout
        assert json.loads((out / "summary.json").read_text())["complete"] is False
    written = json.loads(checkpoint.read_text())["cameras"]["cam"]
    assert written < frames - 1, "interrupted too late: every frame was already written"
    resumed = _process(session, path, out)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert f"resuming {out} after {{'cam': {written}}}" in stdout
    assert (out / "2d" / "cam.jsonl").read_text() == (whole / "2d" / "cam.jsonl").read_text()
    assert json.loads((out / "summary.json").read_text())["persons_posed"] == 2 * frames


def test_a_synchronized_capture_is_read_as_the_recording_stamped_it(tmp_path, write_config):
    """The pass reads `recording:` cameras unpaced, which a shared timeline refuses; the
    recording's capture times already align them, so the pass drops `synchronized`."""
    session, _ = _session(tmp_path)
    path = write_config(CONFIG.replace('kind = "capture"', 'kind = "capture"\nsynchronized = true'))
    config = process.offline_config(path, session, tmp_path / "out")
    assert "synchronized" not in config.stages[0].options


RIG_CONFIG = """
[[cameras]]
name = "cam0"
url = "synthetic:"
[[cameras]]
name = "cam1"
url = "synthetic:"
[[stages]]
kind = "capture"
[[stages]]
kind = "detect"
person = "roi"
person_regions = [{ name = "one", x = 8, y = 4, w = 40, h = 40 }]
face = "none"
to = ["publish", "infer"]
[[stages]]
kind = "infer"
backend = "sim"
to = ["dark"]
[stages.sim]
pacing = "none"
[stages.sapiens2]
enabled = true
synthetic = true
[[stages]]
kind = "dark"
to = ["publish", "rig3d"]
[[stages]]
kind = "rig3d"
rig = "hall"
cameras = ["cam0", "cam1"]
calibration = "Calib.toml"
wait_ms = 1                # live, a group leaves 1 ms after its capture time, posed or not
to = ["publish"]
[[stages]]
kind = "publish"
"""


def test_a_rigs_groups_leave_the_pass_with_every_pose_however_far_behind_it_runs(
    tmp_path, write_config, monkeypatch
):
    """Live, rig3d publishes a group `wait_ms` after its capture time with the poses that
    came; a pass runs behind the recording's clock, so it waits for every pose instead. Here
    rig3d's clock is an hour ahead of the capture times (a pass an hour behind): before, every
    group left at once with no pose and the poses came too late, counted and exit 1."""
    import stages.rig.stage
    from stages.rig.calibration import Calibration, write_calibration
    from tests.stages.rig.rig_scenes import ring_cameras

    hour_behind = stages.rig.stage.now_ns() - time.time_ns() + 3600 * 10**9
    monkeypatch.setattr(stages.rig.stage, "now_ns", lambda: time.time_ns() + hour_behind)
    cams = ring_cameras(np.random.default_rng(0), n=2, size=(64, 48))
    write_calibration(tmp_path / "Calib.toml", Calibration({"cam0": cams[0], "cam1": cams[1]}))
    frames = 4
    session, _ = _session(tmp_path, frames=frames, cameras=("cam0", "cam1"))
    out = tmp_path / "out"
    config = process.offline_config(write_config(RIG_CONFIG), session, out)
    code, summary, _ = asyncio.run(process.run_offline(config, io.StringIO()))
    assert summary["rigs"] == {"hall": {"published": frames, "timed_out": 0, "late_poses": 0}}
    assert code == 0 and summary["drops"] == 0 and summary["persons_posed"] == 2 * frames
    groups = [json.loads(line)["header"] for line in (out / "3d" / "hall.jsonl").open()]
    assert [g["views"] for g in groups] == [{"cam0": s, "cam1": s} for s in range(frames)]
