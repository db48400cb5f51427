"""`npucam calibrate` end to end (stages/commands/calibrate.py, stages/rig/collect.py) on the
rendered ChArUco rig of rig_scenes.py (4 cameras with known lenses and poses, 20 board
poses, blur and noise): written as image folders and MJPG videos, or streamed live over
`zmq:` cameras, calibrated by the command, read back from its file and compared with the
truth at the issue's tolerances (focal length and principal point 1%, translation 1 cm,
rotation 0.5 degrees). Bad input exits 2 with an error naming the camera."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import zmq

from pipeline.cli import main
from pipeline.messages import Frame, now_ns
from stages.frame_wire import encode_frame
from stages.rig.calibration import Calibration, read_calibration, write_calibration

NPUCAM = Path(sys.executable).parent / "npucam"
BOARD_ARGS = ["--squares", "7x5", "--square-length", "0.08", "--marker-length", "0.06"]


def write_folder(folder: Path, images) -> str:
    folder.mkdir(parents=True)
    for i, image in enumerate(images):
        cv2.imwrite(str(folder / f"{i:03d}.png"), image)
    return f"images:{folder}"


def write_video(path: Path, images) -> str:
    h, w = images[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (w, h))
    assert writer.isOpened()
    for image in images:
        writer.write(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR))
    writer.release()
    return str(path)


def angle_deg(r_a: np.ndarray, r_b: np.ndarray) -> float:
    return float(np.degrees(np.linalg.norm(cv2.Rodrigues(r_a @ r_b.T)[0])))


def assert_matches_truth(path: Path, truth) -> None:
    got = list(read_calibration(path).cameras.values())
    assert [c.name for c in got] == [c.name for c in truth]
    for t, c in zip(truth, got, strict=True):
        assert c.size == t.size
        for i, j in ((0, 0), (1, 1), (0, 2), (1, 2)):
            assert abs(c.matrix[i, j] / t.matrix[i, j] - 1) < 0.01, (t.name, i, j)
        assert np.linalg.norm(c.translation - t.translation) < 0.01, t.name
        assert angle_deg(c.extrinsics[:, :3], t.extrinsics[:, :3]) < 0.5, t.name


def test_folders_and_videos_calibrate_to_the_truth(charuco_rig, tmp_path):
    urls = [
        write_folder(tmp_path / "cam0", charuco_rig.images[0]),
        write_folder(tmp_path / "cam1", charuco_rig.images[1]),
        write_video(tmp_path / "cam2.avi", charuco_rig.images[2]),
        write_video(tmp_path / "cam3.avi", charuco_rig.images[3]),
    ]
    out = tmp_path / "Calib.toml"
    cameras = [a for i, u in enumerate(urls) for a in ("--camera", f"cam{i}={u}")]
    run = subprocess.run(
        [str(NPUCAM), "calibrate", *cameras, *BOARD_ARGS, "--world-view", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert_matches_truth(out, charuco_rig.cameras)
    lines = run.stdout.splitlines()
    for i in range(4):  # per camera: views and reprojection error
        assert any(
            re.match(rf"cam{i}: intrinsics from \d+ views, RMS 0\.\d+ px; \d+ shared", x)
            for x in lines
        ), run.stdout
    assert f"wrote {out}" in lines


def test_live_zmq_cameras_are_grouped_by_capture_time_and_calibrate(charuco_rig, tmp_path):
    ctx = zmq.Context()
    pushes, urls = [], []
    for _ in range(4):
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 100)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        pushes.append(sock)
        urls.append(f"zmq:tcp://127.0.0.1:{port}")
    out = tmp_path / "Calib.toml"
    cameras = [a for i, u in enumerate(urls) for a in ("--camera", f"cam{i}={u}")]
    proc = subprocess.Popen(
        [str(NPUCAM), "calibrate", *cameras, *BOARD_ARGS, "--world-view", "0"]
        + ["--captures", "20", "--interval", "0.1", "--duration", "60", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # every round shows one board pose in all four cameras, stamped with one capture
        # time; the first round that reached every camera is board pose 0 (the world view)
        started = None
        k = 0
        end = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < end:
            pose = 0 if started is None else (k - started) % 20
            ts = now_ns()
            sent = 0
            for cam, sock in enumerate(pushes):
                image = cv2.cvtColor(charuco_rig.images[cam][pose], cv2.COLOR_GRAY2BGR)
                try:
                    sock.send_multipart(encode_frame(Frame(f"cam{cam}", k, ts, ts, image), "raw"))
                    sent += 1
                except zmq.Again:
                    pass  # its reader has not connected yet
            if started is None and sent == 4:
                started = k
            k += 1
            time.sleep(0.25)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        for sock in pushes:
            sock.close()
        ctx.term()
    assert proc.returncode == 0, stderr
    assert stdout.count("capture ") == 20, stdout
    assert_matches_truth(out, charuco_rig.cameras)


@pytest.fixture
def folders(charuco_rig, tmp_path):
    """camera name -> its images (gray uint8), to edit before writing."""
    return {f"cam{i}": list(images) for i, images in enumerate(charuco_rig.images)}


def calibrate(tmp_path: Path, folders: dict, capsys, *extra: str) -> tuple[int, str]:
    args = ["calibrate", *BOARD_ARGS, "--out", str(tmp_path / "Calib.toml"), *extra]
    for name, images in folders.items():
        args += ["--camera", f"{name}={write_folder(tmp_path / name, images)}"]
    code = main(args)
    return code, capsys.readouterr().err


def test_a_camera_that_never_sees_the_board_is_named(tmp_path, folders, capsys):
    folders["cam1"] = [np.full((720, 960), 255, np.uint8)] * 5
    code, err = calibrate(tmp_path, folders, capsys)
    assert code == 2 and "camera 'cam1': the board was not found in any of its" in err


def test_too_few_views_are_named_with_the_minimum(tmp_path, folders, capsys):
    folders = {"cam0": folders["cam0"][:2]}
    code, err = calibrate(tmp_path, folders, capsys)
    assert code == 2 and "camera 'cam0': the board was found in 2 of 2 images" in err
    assert "at least 3" in err


def test_images_of_another_size_are_named(tmp_path, folders, capsys):
    folders["cam2"][4] = cv2.resize(folders["cam2"][4], (640, 480))
    code, err = calibrate(tmp_path, folders, capsys)
    assert code == 2 and "camera 'cam2': frame 4 is 640x480 but its first frame is 960x720" in err


def test_a_camera_sharing_no_view_is_named(tmp_path, folders, capsys):
    blank = np.full((720, 960), 255, np.uint8)
    for name in ("cam0", "cam1", "cam2"):
        folders[name] = folders[name][:10] + [blank] * 10
    folders["cam3"] = [blank] * 10 + folders["cam3"][10:]
    code, err = calibrate(tmp_path, folders, capsys)
    assert code == 2 and "camera(s) 'cam3' share no view of the board" in err


def test_a_source_that_gives_no_frames_is_named(tmp_path, capsys):
    out = str(tmp_path / "Calib.toml")
    code = main(["calibrate", "--camera", f"door=images:{tmp_path}/none", "--out", out])
    err = capsys.readouterr().err
    assert code == 2 and "camera 'door': no frames from images:" in err and "no such folder" in err
    assert not Path(out).exists()


def test_live_and_recorded_cameras_cannot_be_mixed(tmp_path, capsys):
    args = ["calibrate", "--camera", "a=usb:0", "--camera", f"b=images:{tmp_path}"]
    code = main([*args, "--out", str(tmp_path / "c.toml")])
    assert code == 2 and "are live and b recorded" in capsys.readouterr().err


def test_given_lenses_calibrate_the_poses_only(charuco_rig, tmp_path, folders, capsys):
    lenses = tmp_path / "lenses.toml"
    write_calibration(
        lenses, Calibration({f"cam_{i + 1:02d}": c for i, c in enumerate(charuco_rig.cameras)})
    )
    code, err = calibrate(
        tmp_path, folders, capsys, "--intrinsics", str(lenses), "--world-view", "0"
    )
    assert code == 0, err
    got = read_calibration(tmp_path / "Calib.toml")
    for truth, cam in zip(charuco_rig.cameras, got.cameras.values(), strict=True):
        assert np.array_equal(cam.matrix, truth.matrix)  # the given lens, as given
        assert np.linalg.norm(cam.translation - truth.translation) < 0.01
    small = {"cam0": [cv2.resize(i, (480, 360)) for i in folders["cam0"]], "cam1": folders["cam1"]}
    code, err = calibrate(tmp_path / "small", small, capsys, "--intrinsics", str(lenses))
    assert code == 2 and "camera 'cam0': its images are 480x360 but" in err
