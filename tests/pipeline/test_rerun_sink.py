"""`npucam rerun` (pipeline/rerun_commands.py, pipeline/rerun_sink.py): a publisher's meta,
det, preview, pose, pose3d and body messages, in their wire form from the result classes the
stages publish, received over ZeroMQ, written to an .rrd and read back with Rerun's own reader
(rerun.chunk.RrdReader): the entities, their row counts, the capture timeline, and a person
who left cleared."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path

import cv2
import numpy as np
import pytest
import zmq

from pipeline import wire
from pipeline.cli import main
from pipeline.messages import Detections
from stages.meta import contract
from stages.models.sapiens2.result import PoseResult
from stages.rig.pose3d import Pose3DResult

rr = pytest.importorskip("rerun")
from rerun.chunk import RrdReader  # noqa: E402

K = 308
T0 = 1_764_000_000_000_000_000  # capture times, ns
GROUPS = 3


def _messages() -> list[list]:
    """meta, then per instant i: det and preview of cam01 (the preview at half size), a pose
    per track 0 and 1, and a pose3d of rig `lab` (people 0 and 1; only 0 at the last) and a
    body message for its people."""
    meta = {"kind": "meta", "camera": "", "seq": 0, "capture_ts": T0, "publish_ts": T0,
            "backend": "none", "model": "none", "synthetic": False, "meta": contract()}  # fmt: skip
    out = [wire.encode("meta", meta)]
    rng = np.random.default_rng(0)
    image = np.full((120, 160, 3), 90, np.uint8)
    for i in range(GROUPS):
        ts = T0 + i * 33_000_000
        common = {"seq": i, "capture_ts_ns": ts, "deadline_ns": ts + 10**9}
        det = Detections(
            camera="cam01", width=320, height=240, labels=("person", "person"),
            boxes=np.array([[10, 20, 110, 220], [150, 30, 260, 230]], np.float32),
            scores=np.array([0.9, 0.8], np.float32), **common,
        )  # fmt: skip
        out.append(wire.encode_result(det, ts))
        jpeg = cv2.imencode(".jpg", image)[1].reshape(-1)
        header = {"kind": "preview", "camera": "cam01", "seq": i, "capture_ts": ts,
                  "publish_ts": ts, "backend": "none", "model": "none", "synthetic": False,
                  "width": 160, "height": 120}  # fmt: skip
        out.append(wire.encode("preview/cam01", header, [("jpeg", jpeg)], {"jpeg": "jpeg"}))
        for track in (0, 1):
            kp = np.column_stack([rng.uniform(0, 320, (K, 2)), np.zeros(K)]).astype(np.float32)
            kp[:17, 2] = 0.9  # 17 scored points, the rest absent
            extra = {"live": True} if track == 1 else {}  # track 1's is a per-frame pose
            pose = PoseResult(camera="cam01", track_id=track, keypoints=kp, extra=extra, **common)
            out.append(wire.encode_result(pose, ts))
        people = 2 if i < GROUPS - 1 else 1
        points = np.full((people, K, 4), np.nan, np.float32)
        points[:, :20, :3] = rng.normal(size=(people, 20, 3))
        points[..., 3] = np.where(np.isfinite(points[..., 0]), 0.8, 0.0)
        p3 = Pose3DResult(
            camera="lab", cameras=("cam01", "cam02"), points=points,
            error=np.zeros((people, K), np.float32), used=np.ones((people, K, 2), np.uint8),
            person_ids=tuple(range(people)), tracks=tuple({"cam01": p} for p in range(people)),
            **common,
        )  # fmt: skip
        out.append(wire.encode_result(p3, ts))
        body = {"kind": "body", "camera": "lab", "seq": i, "capture_ts": ts, "publish_ts": ts,
                "backend": "cpu", "model": "anny", "synthetic": False, "count": people,
                "person_ids": list(range(people))}  # fmt: skip
        fitted = rng.normal(size=(people, 23, 3)).astype(np.float32)
        out.append(wire.encode("body/lab", body, [("keypoints", fitted)]))
    return out


def _publish_once_subscribed(pub: zmq.Socket, messages: list[list], topics: int) -> None:
    """XPUB: wait for the subscriber's `topics` subscriptions, then send every message."""
    seen = 0
    while seen < topics:
        if pub.poll(10_000):
            seen += pub.recv()[0] == 1
        else:
            return
    for m in messages:
        pub.send_multipart(m)


def test_a_published_run_is_saved_as_an_rrd_rerun_reads_back(tmp_path, capsys):
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    messages = _messages()
    sender = threading.Thread(target=_publish_once_subscribed, args=(pub, messages, 6))
    sender.start()
    path = tmp_path / "run.rrd"
    try:
        code = main(
            ["rerun", f"tcp://127.0.0.1:{port}", "--save", str(path),
             "--count", str(len(messages)), "--duration", "30"]
        )  # fmt: skip
    finally:
        sender.join()
        pub.close()
        ctx.term()
    assert code == 0
    assert "logged body 3, det 3, meta 1, pose 6, pose3d 3, preview 3" in capsys.readouterr().err

    rows: Counter[str] = Counter()
    times: dict[str, set] = defaultdict(set)
    columns: dict[str, set] = defaultdict(set)
    for chunk in RrdReader(path).stream():
        batch = chunk.to_record_batch()
        columns[chunk.entity_path].update(batch.schema.names)
        if chunk.is_static:
            continue
        rows[chunk.entity_path] += chunk.num_rows
        if "capture" in batch.schema.names:
            times[chunk.entity_path].update(int(t.value) for t in batch.column("capture"))
    expected_ts = {T0 + i * 33_000_000 for i in range(GROUPS)}
    # an image and its scale to the frame's pixels per preview
    assert rows["/cameras/cam01/image"] == 2 * GROUPS
    assert "EncodedImage:blob" in columns["/cameras/cam01/image"]
    assert rows["/cameras/cam01/boxes"] == GROUPS
    assert rows["/cameras/cam01/pose/0"] == rows["/cameras/cam01/live_pose/1"] == GROUPS
    assert "/cameras/cam01/pose/1" not in rows
    # person 1 is in two pose3d and body messages, then cleared once in each
    assert rows["/rigs/lab/people/0"] == GROUPS and rows["/rigs/lab/people/1"] == GROUPS
    assert rows["/rigs/lab/bodies/0"] == GROUPS and rows["/rigs/lab/bodies/1"] == GROUPS
    assert "Points3D:keypoint_ids" in columns["/rigs/lab/people/0"]
    assert any("Clear" in c for c in columns["/rigs/lab/people/1"])
    for entity in ("/cameras/cam01/image", "/cameras/cam01/pose/0", "/rigs/lab/people/0"):
        assert times[entity] == expected_ts, entity
    # the skeleton: one static annotation context with the meta message's edges
    assert any("AnnotationContext" in c for c in columns["/"])


def test_without_rerun_sdk_the_command_names_the_extra(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_rerun(name, *a, **kw):
        if name == "rerun":
            raise ImportError("no rerun")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_rerun)
    code = main(["rerun", "tcp://127.0.0.1:1", "--save", "x.rrd"])
    assert code != 0
    assert "npucam[rerun]" in capsys.readouterr().err


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_real_run_of_the_two_person_rig_is_recorded_with_every_camera_and_person(
    tmp_path, free_port
):
    """configs/studio-3d-multi.toml with previews on, run for 45 s, recorded for 40."""
    text = (REPO / "configs" / "studio-3d-multi.toml").read_text()
    endpoint = f"tcp://127.0.0.1:{free_port}"
    bind = 'bind = "tcp://127.0.0.1:5565"'
    assert text.count(bind) == 1
    text = text.replace(bind, f'bind = "{endpoint}"\npreview = true')
    config = tmp_path / "studio-3d-multi.toml"
    config.write_text(text.replace('"../.cache', f'"{REPO}/.cache'))
    run = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(config), "--duration", "45"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    path = tmp_path / "run.rrd"
    try:
        assert main(["rerun", endpoint, "--save", str(path), "--duration", "40"]) == 0
    finally:
        run.wait(timeout=120)
    rows: Counter[str] = Counter()
    for chunk in RrdReader(path).stream():
        if not chunk.is_static:
            rows[chunk.entity_path] += chunk.num_rows
    people = [e for e in rows if e.startswith("/rigs/lab/people/")]
    assert len(people) == 2, rows  # two people, one rig id each
    for cam in ("cam01", "cam02", "cam03", "cam04"):
        assert rows[f"/cameras/{cam}/image"] > 0 and rows[f"/cameras/{cam}/boxes"] > 0, cam
        live = [e for e in rows if e.startswith(f"/cameras/{cam}/live_pose/")]
        assert len(live) == 2, (cam, rows)
    assert min(rows[e] for e in people) >= 10  # pose3d at ~1 a second for most of the 40 s
