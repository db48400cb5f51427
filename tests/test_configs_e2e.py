"""The shipped configs as a user runs them (`npucam run`, a SUB socket on the published
endpoint): the demo publishes det, pose, face and clip messages for both sample cameras;
multicam-pose and face-kiosk validate and run briefly on the simulated NPU."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import zmq

from pipeline import wire

REPO = Path(__file__).resolve().parents[1]
NPUCAM = Path(sys.executable).parent / "npucam"


def run_and_collect(config: str, endpoint: str, duration: float, grace: float = 60.0):
    """Run `npucam run config --duration`, SUBscribed to everything on endpoint.
    Returns (returncode, stderr, {kind: {camera: [headers]}}, {kind: [(header, arrays)]})."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    proc = subprocess.Popen(
        [str(NPUCAM), "run", config, "--duration", str(duration)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    got: dict = defaultdict(lambda: defaultdict(list))
    arrays: dict = defaultdict(list)
    try:
        end = time.monotonic() + duration + grace
        while time.monotonic() < end and proc.poll() is None:
            if sub.poll(200):
                msg = wire.decode(sub.recv_multipart())
                got[msg.header["kind"]][msg.header["camera"]].append(msg.header)
                arrays[msg.header["kind"]].append((msg.header, msg.arrays))
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        sub.close()
        ctx.term()
    return proc.returncode, err, got, arrays


@pytest.mark.slow
def test_demo_publishes_det_pose_face_and_clip_for_both_cameras():
    code, err, got, arrays = run_and_collect(
        "configs/demo.toml", "tcp://127.0.0.1:5560", duration=20
    )
    assert code == 0, err
    for kind in ("det", "pose", "face", "clip"):
        assert set(got[kind]) == {"bikes", "carphone"}, f"{kind}: {dict(got[kind])}\n{err}"
    for kind in ("pose", "face", "clip"):
        for headers in got[kind].values():
            for h in headers:  # no bundles here: the synthetic models, and they say so
                assert h["synthetic"] is True and h["backend"] == "sim", h
    assert "SYNTHETIC" in err
    for h in (h for hs in got["det"].values() for h in hs):
        assert h["model"] == "blazepose-detector+blazeface-short" and not h["synthetic"]
        assert len(h["track_ids"]) == h["count"] == len(h["labels"])
    for h in (h for hs in got["pose"].values() for h in hs):
        assert isinstance(h["track_id"], int) and h["count"] == 308 and h["age_ms"] >= 0
    for _, a in arrays["pose"]:
        assert a["keypoints"].shape == (308, 3) and a["keypoints"].dtype == np.float32
    for _, a in arrays["face"]:
        assert a["embedding"].shape == (512,)
        assert abs(float(np.linalg.norm(a["embedding"])) - 1) < 1e-5
    for h, a in arrays["clip"]:
        assert abs(float(a["probabilities"].sum()) - 1) < 1e-5
        assert h["top_label"] in h["labels"]


@pytest.mark.parametrize(
    "config", ["configs/multicam-pose.toml", "configs/face-kiosk.toml", "configs/multicam-3d.toml"]
)
def test_configs_validate(config):
    out = subprocess.run(
        [str(NPUCAM), "validate", config], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_multicam_pose_runs_briefly_on_sim_with_det_for_4_cameras_and_tracked_poses():
    code, err, got, arrays = run_and_collect(
        "configs/multicam-pose.toml", "tcp://127.0.0.1:5561", duration=10
    )
    assert code == 0, err
    assert set(got["det"]) == {"bikes", "carphone", "bunny", "bikes2"}, err
    assert got["pose"], f"no pose message\n{err}"
    assert "face" not in got and "clip" not in got
    for hs in got["pose"].values():
        assert all(isinstance(h["track_id"], int) and h["synthetic"] for h in hs)
    assert all(a["keypoints"].shape == (308, 3) for _, a in arrays["pose"])


def test_face_kiosk_runs_briefly_on_sim_with_identities_on_face_topic():
    code, err, got, arrays = run_and_collect(
        "configs/face-kiosk.toml", "tcp://127.0.0.1:5562", duration=8
    )
    assert code == 0, err
    assert set(got["face"]) == {"kiosk"}, err
    for h in got["face"]["kiosk"]:
        assert h["identity"] is None or isinstance(h["identity"], str)
        assert h["landmark_source"] == "blazeface" and h["synthetic"]
    for _, a in arrays["face"]:
        assert a["landmarks"].shape == (4, 2) and a["box"].shape == (4,)
        assert abs(float(np.linalg.norm(a["embedding"])) - 1) < 1e-5
    assert "pose" not in got and "clip" not in got
