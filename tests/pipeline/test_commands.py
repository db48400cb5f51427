"""The engine's CLI commands: validate, subscribe, and config errors as exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from pipeline import wire
from pipeline.cli import main
from pipeline.messages import Detections, Frame

REPO = Path(__file__).resolve().parents[2]


def test_validate_reports_ok_for_the_demo(capsys):
    assert main(["validate", str(REPO / "configs" / "demo.toml")]) == 0
    assert "ok (2 camera(s): bikes, carphone" in capsys.readouterr().out


def test_a_bad_config_exits_2_with_the_key_path(write_config, capsys):
    path = write_config('[[cameras]]\nname = "a"\nurl = 5\n[[stages]]\nkind = "capture"\n')
    assert main(["run", str(path)]) == 2
    assert f"npucam: error: {path}: cameras[0].url: expected a string" in capsys.readouterr().err


def test_subscribe_prints_one_json_line_per_message_and_skips_malformed(free_port):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "subscribe",
            endpoint,
            "--topic",
            "det/",
            "--count",
            "2",
            "--timeout",
            "10",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    frame = Frame("cam", 3, 10, 20, np.zeros((4, 6, 3), np.uint8))
    det = Detections.without_detector(frame)
    det.boxes = np.arange(8, dtype=np.float32).reshape(2, 4)
    det.scores = np.array([0.5, 0.25], np.float32)
    stop = threading.Event()

    def keep_publishing():  # until the subscriber has joined and seen enough
        while not stop.is_set():
            pub.send_multipart([b"det/cam", b"{broken"])
            pub.send_multipart(wire.encode_result(det, 30))
            pub.send_multipart(wire.encode_result(det, 30))
            time.sleep(0.05)

    t = threading.Thread(target=keep_publishing)
    t.start()
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        stop.set()
        t.join()
        pub.close()
        ctx.term()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 2
    assert lines[0]["topic"] == "det/cam" and lines[0]["seq"] == 3
    assert lines[0]["parts"]["boxes"] == {
        "dtype": "float32",
        "shape": [2, 4],
        "values": det.boxes.tolist(),
    }
    assert "skipped malformed message" in err


# ---- validate catches what run would die on, each with the file and key -------------------


def validate(path, capsys) -> tuple[int, str, str]:
    code = main(["validate", str(path)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_refuses_an_even_dark_kernel_that_fails_every_pose(write_config, capsys):
    path = write_config(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n[[stages]]\nkind = "capture"\n'
        'to = ["dark"]\n[[stages]]\nkind = "dark"\nkernel = 4\n'
    )
    code, _, err = validate(path, capsys)
    assert code == 2
    assert f"{path}: stages[1].kernel: expected an odd integer (got an integer: 4)" in err


def test_validate_refuses_a_camera_that_is_not_a_video(write_config, make_clip, capsys):
    notes = write_config("just some text\n", name="notes.mp4")
    path = write_config(f'[[cameras]]\nname = "a"\nurl = "{notes}"\n[[stages]]\nkind = "capture"\n')
    code, _, err = validate(path, capsys)
    assert code == 2 and f"{path}: cameras[0].url: {notes}: not a video OpenCV can open" in err
    clip = make_clip("ok.avi")
    path = write_config(f'[[cameras]]\nname = "a"\nurl = "{clip}"\n[[stages]]\nkind = "capture"\n')
    assert validate(path, capsys)[0] == 0  # a real video passes


def test_validate_refuses_an_image_folder_without_images(write_config, tmp_path, capsys):
    (tmp_path / "frames").mkdir()
    (tmp_path / "frames" / "readme.txt").write_text("x")
    path = write_config(
        '[[cameras]]\nname = "a"\nurl = "images:frames"\n[[stages]]\nkind = "capture"\n'
    )
    code, _, err = validate(path, capsys)
    assert code == 2 and "cameras[0].url: " in err and "no image files" in err


def test_validate_refuses_an_empty_bundle_folder_naming_the_key(write_config, tmp_path, capsys):
    (tmp_path / "empty-bundle").mkdir()
    path = write_config(
        '[[stages]]\nkind = "infer"\nbackend = "sim"\n[stages.sapiens2]\nenabled = true\n'
        'bundle = "empty-bundle"\n'
    )
    code, _, err = validate(path, capsys)
    assert code == 2 and f"{path}: stages[0].sapiens2.bundle: not a usable bundle" in err


def test_validate_refuses_a_text_file_as_gallery_without_a_pickle_message(write_config, capsys):
    write_config("alice\nbob\n", name="gallery.npz")
    path = write_config(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n[[stages]]\nkind = "capture"\n'
        'to = ["face_match"]\n[[stages]]\nkind = "face_match"\ngallery = "gallery.npz"\n'
    )
    code, _, err = validate(path, capsys)
    assert code == 2 and "pickle" not in err
    assert f"{path}: stages[1].gallery: " in err and "not a readable face gallery" in err


def test_validate_warns_about_a_missing_gallery_naming_the_file_and_key(write_config, capsys):
    path = write_config(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n[[stages]]\nkind = "capture"\n'
        'to = ["face_match"]\n[[stages]]\nkind = "face_match"\ngallery = "nobody.npz"\n'
    )
    code, out, err = validate(path, capsys)
    assert code == 0 and "ok" in out
    assert f"warning: {path}: stages[1].gallery: " in err
    assert "nobody.npz: no such gallery file" in err and "npucam face enroll" in err
