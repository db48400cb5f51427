"""`npucam subscribe` against a hostile publisher: it prints every message it can, reports
the others on stderr without a traceback, and never decodes a preview JPEG larger than
--max-pixels.

Before the fix a header nested 100000 deep ended the subscriber with RecursionError, one
whose seq had 5000 digits with ValueError (json.dumps cannot write the int back), and a
631-byte preview JPEG claiming 16384 x 16384 was decoded to 805 MB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zmq
from hostile_inputs import deep_header, giant_int_header, jpeg_claiming

from pipeline import wire
from pipeline.messages import Detections, Frame

REPO = Path(__file__).resolve().parents[2]


def preview(jpeg: bytes) -> list:
    header = {
        "kind": "preview",
        "camera": "cam",
        "seq": 7,
        "capture_ts": 1,
        "publish_ts": 2,
        "backend": "none",
        "model": "none",
        "synthetic": False,
        "width": 16384,
        "height": 16384,
    }
    part = np.frombuffer(jpeg, np.uint8)
    return wire.encode("preview/cam", header, [("jpeg", part)], {"jpeg": "jpeg"})


# npucam, run so that it writes its own peak RSS (VmHWM) to argv[1] as it exits. rusage's
# ru_maxrss of a child is no use here: Linux carries the forking parent's high-water mark
# (this pytest process, gigabytes late in a run) over the exec into the child's figure.
WITH_PEAK_RSS = """
import atexit, runpy, sys
out = sys.argv.pop(1)
def peak():
    with open("/proc/self/status") as f:
        hwm = next(line for line in f if line.startswith("VmHWM:"))
    with open(out, "w") as f:
        f.write(hwm.split()[1])  # KiB
atexit.register(peak)
sys.argv[0] = "npucam"
runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
"""


def test_subscribe_reports_hostile_messages_and_keeps_printing_without_a_traceback(
    free_port, tmp_path
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    det = Detections.without_detector(Frame("cam", 3, 10, 20, np.zeros((4, 6, 3), np.uint8)))
    good = wire.encode_result(det, 30)
    hostile = [
        [good[0], deep_header(bytes(good[1]))],
        [good[0], giant_int_header(bytes(good[1]))],
        preview(jpeg_claiming(16384, 16384)),
    ]
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    hwm = tmp_path / "peak-rss-kib"
    args = [sys.executable, "-c", WITH_PEAK_RSS, str(hwm), "subscribe", endpoint, "--count", "4"]
    proc = subprocess.Popen(
        [*args, "--timeout", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    stop = threading.Event()

    def keep_publishing():  # until the subscriber has joined and seen enough
        while not stop.is_set():
            for msg in hostile:
                pub.send_multipart(msg)
            pub.send_multipart(good)
            time.sleep(0.05)

    t = threading.Thread(target=keep_publishing)
    t.start()
    try:
        out, err = proc.communicate()
    finally:
        stop.set()
        t.join()
        pub.close()
        ctx.term()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 4
    previews = [x for x in lines if x["topic"] == "preview/cam"]
    assert previews and all("refused" in x["parts"]["jpeg"] for x in previews)
    assert all(x["seq"] == 3 for x in lines if x["topic"] == "det/cam")
    assert "nested 100001 deep, over the limit of 32" in err
    assert "a number of 5000 digits, over the limit of 40" in err
    assert "JPEG claims 16384x16384 pixels, over the limit of 8294400" in err
    assert "malformed message(s)" in err.splitlines()[-1]
    assert int(hwm.read_text()) < 400 * 1024  # KiB: the 805 MB frame was never decoded


def test_subscribe_skips_a_message_whose_parts_together_pass_the_limit(free_port):
    """Issue 33: `--max-message-bytes` bounded each part (ZMQ_MAXMSGSIZE), not the message: 20
    parts of 50 MB took it to 1.1 GB. Now the parts are added up as they are read and a
    message over the limit is skipped, reported, and none of its parts kept (scaled down
    here: 20 parts of 256 KiB against a 1 MiB limit)."""
    endpoint = f"tcp://127.0.0.1:{free_port}"
    det = Detections.without_detector(Frame("cam", 3, 10, 20, np.zeros((4, 6, 3), np.uint8)))
    good = wire.encode_result(det, 30)
    blob = np.zeros(256 << 10, np.uint8)
    big = wire.encode("meta", {"kind": "meta", "camera": "", "seq": 0, "capture_ts": 1,
                               "publish_ts": 1, "backend": "none", "model": "none",
                               "synthetic": False},
                      [(f"p{i}", blob) for i in range(20)])  # fmt: skip
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    args = [sys.executable, "-m", "pipeline", "subscribe", endpoint, "--count", "3"]
    proc = subprocess.Popen(
        [*args, "--timeout", "10", "--max-message-bytes", str(1 << 20)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    stop = threading.Event()

    def keep_publishing():
        while not stop.is_set():
            pub.send_multipart(big)
            pub.send_multipart(good)
            time.sleep(0.05)

    t = threading.Thread(target=keep_publishing)
    t.start()
    try:
        out, err = proc.communicate()
    finally:
        stop.set()
        t.join()
        pub.close()
        ctx.term()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [x["topic"] for x in lines] == ["det/cam"] * 3
    size = sum(len(p) for p in big)
    assert f"skipped a message of {size} bytes, over --max-message-bytes {1 << 20}" in err
    assert "Traceback" not in err
