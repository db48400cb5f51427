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
