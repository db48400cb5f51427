"""`npucam calibrate people` (stages/commands/calibrate.py): videos named by their cameras, the
lenses from --intrinsics, the file written. The 2D model is replaced by the synthetic walk of
test_people_calibration.py seen through the lab's real cameras (1 px noise); the real videos
run in tests/stages/rig/test_people_calibration_demo.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rig_scenes import walking_body

from pipeline.cli import main
from stages.commands import calibrate as command
from stages.landmarks.video import VideoPeople
from stages.rig.calibration import read_calibration
from stages.rig.rig_alignment import align_rigs

CALIB = Path(__file__).parent / "data" / "pose2sim_Calib_qualisys.toml"
HALF_WIDTH = (544, 1920)  # cam_02's video as if decoded at half the calibrated width


@pytest.fixture
def fake_videos(monkeypatch):
    """video_people replaced: each camera's view of the walk; cam_02's at HALF_WIDTH."""
    truth = read_calibration(CALIB)
    points = walking_body(40, np.array([-0.9, 0.0]))
    made = np.isfinite(points).all(-1)
    rng = np.random.default_rng(1)
    calls = []

    def video_people(path, max_people=1, frames=0, fps=60.0, hands=False):
        cam = truth.camera(Path(path).stem)
        kp = np.full(points.shape, np.nan)
        kp[made, :2] = cam.project(points[made]) + rng.normal(0, 1.0, (made.sum(), 2))
        kp[made, 2] = 0.9
        size = cam.size
        if cam.name == "cam_02":
            kp[..., :2] *= np.divide(HALF_WIDTH, cam.size)
            size = HALF_WIDTH
        calls.append((Path(path).name, max_people, hands))
        return VideoPeople(kp[:, None], (0,), size)

    monkeypatch.setattr(command, "video_people", video_people)
    return truth, calls


def _videos(tmp_path: Path, names) -> list[str]:
    return [str(tmp_path / f"{n}.mp4") for n in names]


def test_writes_the_rig_with_the_given_lenses_rescaling_a_resized_video(
    fake_videos, tmp_path, capsys
):
    truth, calls = fake_videos
    out = tmp_path / "Calib.toml"
    names = ["cam_01", "cam_02", "cam_03", "cam_04"]
    apart = np.linalg.norm(truth.camera("cam_01").centre - truth.camera("cam_03").centre)
    args = ["calibrate", "people", *_videos(tmp_path, names), "--intrinsics", str(CALIB)]
    code = main([*args, "--distance", "cam_01", "cam_03", f"{apart:.6f}", "-o", str(out)])
    said = capsys.readouterr().out
    assert code == 0
    assert calls == [(f"{n}.mp4", 1, True) for n in names]  # one person, with the hands
    assert "cam_02: " in said and "544x1920" in said and "keypoints rescaled" in said
    assert "scale from the cam_01-cam_03 distance" in said and f"wrote {out}" in said
    written = read_calibration(out)
    assert list(written.cameras) == list(truth.cameras)  # the intrinsics file's tables
    alignment = align_rigs(list(written.cameras.values()), list(truth.cameras.values()))
    assert alignment.centre_error.max() < 0.005
    assert alignment.rotation_error.max() < 0.15
    assert alignment.scale == pytest.approx(1.0, abs=0.005)
    assert written.metadata["adjusted"] is True


def test_a_video_named_after_no_camera_is_refused(fake_videos, tmp_path, capsys):
    names = ["cam_01", "door"]
    args = ["calibrate", "people", *_videos(tmp_path, names), "--intrinsics", str(CALIB)]
    code = main([*args, "--height", "1.7", "-o", str(tmp_path / "c.toml")])
    assert code == 2 and "no camera named 'door'" in capsys.readouterr().err
    assert not (tmp_path / "c.toml").exists()


def test_a_distance_that_is_not_a_number_is_refused(fake_videos, tmp_path, capsys):
    args = ["calibrate", "people", *_videos(tmp_path, ["cam_01", "cam_02"])]
    args += ["--intrinsics", str(CALIB), "--distance", "cam_01", "cam_02", "far"]
    code = main([*args, "-o", str(tmp_path / "c.toml")])
    assert code == 2 and "'far' is not metres" in capsys.readouterr().err
