"""docs/examples/subscriber.mjs, the Node.js subscriber of docs/protocol.md, against the demo:
it decodes every kind, and each value it prints (dtype, shape, leading values, sums, exact ns
timestamps, the JPEG's own size) equals what pipeline.wire decodes from the same message. The
shorter Node.js example in docs/protocol.md runs beside it and prints the poses."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from pipeline import wire
from tests.pacing import PACINGS, set_pacing

pytestmark = pytest.mark.heavy  # a whole pipeline run (tests/conftest.py)

REPO = Path(__file__).resolve().parents[3]
NPUCAM = Path(sys.executable).parent / "npucam"
EXAMPLE = REPO / "docs" / "examples" / "subscriber.mjs"
KINDS = {"det", "pose", "face", "clip", "stats", "meta", "preview"}
# the Node.js subscribers listen until the example has printed every kind and the docs' example
# a pose (then SIGINT: the example closes and exits 0); a hang guard, not a duration
NODE_GUARD_S = 150


def node_subscriber(node: str, endpoint: str, seconds: float, out) -> subprocess.Popen:
    """docs/examples/subscriber.mjs on endpoint for `seconds`, its JSON lines into `out`."""
    return subprocess.Popen(
        [node, str(EXAMPLE), endpoint, "--seconds", str(seconds)],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.PIPE,
        text=True,
    )


def sequential_sum(values) -> float:
    """Left-to-right float64 sum of the finite values, the order the example adds in."""
    total = 0.0
    for v in values:
        if math.isfinite(float(v)):
            total += float(v)
    return total


def head(array) -> list[float | None]:
    """The first six values as the example prints them (NaN as JSON null)."""
    return [None if math.isnan(float(v)) else float(v) for v in array.ravel()[:6].tolist()]


def assert_parts_decoded(line: dict, msg: wire.Message) -> None:
    """Each part the example summarised is the part pipeline.wire decoded."""
    h = msg.header
    assert (line["capture_ts"], line["publish_ts"]) == (str(h["capture_ts"]), str(h["publish_ts"]))
    assert line["lag_ms"] == pytest.approx((h["publish_ts"] - h["capture_ts"]) / 1e6, abs=1e-6)
    assert set(line["parts"]) == set(msg.arrays)
    for name, got in line["parts"].items():
        a = msg.arrays[name]
        assert (got["dtype"], got["shape"], got["n"]) == (a.dtype.name, list(a.shape), a.size)
        assert got["head"] == head(a), (line["topic"], name)
        assert got["sum"] == sequential_sum(a.ravel().tolist()), (line["topic"], name)
        assert got["nonfinite"] == int((~np.isfinite(a.astype(np.float64))).sum())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pacing", PACINGS)
def test_the_node_subscriber_decodes_every_kind_as_pipeline_wire_does(
    demo_config, tmp_path, pacing
):
    node = shutil.which("node")
    assert node, "no node: run `make setup-test`"
    assert (EXAMPLE.parent / "node_modules" / "zeromq").is_dir(), "run `make setup-test`"
    config, endpoint = demo_config
    set_pacing(config, pacing)
    doc = (REPO / "docs" / "protocol.md").read_text()
    doc_example = tmp_path / "pose.mjs"
    doc_example.write_text(re.search(r"```js\n(.*?)```", doc, re.S).group(1))
    (tmp_path / "node_modules").symlink_to(EXAMPLE.parent / "node_modules")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 100_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    run = subprocess.Popen(
        [str(NPUCAM), "run", str(config), "--duration", str(NODE_GUARD_S + 30)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # (topic, seq, publish_ts) names one message: a frame can have several poses, faces, labels
    ours: dict[tuple[str, int, str], wire.Message] = {}
    node_lines = tmp_path / "node.jsonl"
    doc_lines = tmp_path / "pose.txt"
    out, doc_out_file = node_lines.open("w"), doc_lines.open("w")
    js = node_subscriber(node, endpoint, NODE_GUARD_S, out)
    doc_js = subprocess.Popen(
        [node, str(doc_example), endpoint], stdout=doc_out_file, stderr=subprocess.PIPE, text=True
    )

    def printed_everything() -> bool:
        whole = node_lines.read_text().split("\n")[:-1]  # the last may be half written
        kinds = {json.loads(line)["kind"] for line in whole}
        return kinds >= KINDS and bool(doc_lines.read_text().strip())

    try:
        end = time.monotonic() + NODE_GUARD_S
        look = time.monotonic()
        while js.poll() is None and time.monotonic() < end:
            if sub.poll(100):
                msg = wire.decode(sub.recv_multipart())
                ours[msg.topic, msg.header["seq"], str(msg.header["publish_ts"])] = msg
            if time.monotonic() >= look:
                if printed_everything():
                    break
                look = time.monotonic() + 0.5
        js.send_signal(signal.SIGINT)
        js_code = js.wait(timeout=10)
        js_err = js.stderr.read()
    finally:
        js.kill()
        doc_js.kill()
        _, doc_err = doc_js.communicate(timeout=10)
        out.close()
        doc_out_file.close()
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=15)
        sub.close()
        ctx.term()
    doc_out = doc_lines.read_text()
    assert js_code == 0, js_err
    assert "skipped" not in js_err, js_err
    lines = [json.loads(line) for line in node_lines.read_text().splitlines()]
    assert {line["kind"] for line in lines} == KINDS, run.stderr.read()[-2000:]

    docs_meta = json.loads((REPO / "docs" / "meta.json").read_text())
    matched = 0
    for line in lines:
        assert line["ts_exact"], line["topic"]
        if line["kind"] == "meta":
            assert line["meta"]["consistent"] and line["meta"]["keypoints"] == 308
            colours = {g["name"]: g["color"] for g in docs_meta["pose"]["groups"]}
            assert line["meta"]["colours"] == colours
        msg = ours.get((line["topic"], line["seq"], line["publish_ts"]))
        if msg is None:
            continue  # published before the Python subscriber joined
        matched += 1
        h = msg.header
        assert_parts_decoded(line, msg)
        if line["kind"] == "pose":
            assert line["pose"]["count"] == line["pose"]["meta_count"] == h["count"] == 308
            assert line["parts"]["keypoints"]["shape"] == [308, 3]
            nose = msg.arrays["keypoints"][docs_meta["pose"]["names"].index("nose")]
            assert line["pose"]["nose"] == [float(v) for v in nose.tolist()]
        if line["kind"] == "preview":
            assert line["preview"]["jpeg_size"] == [h["height"], h["width"]]
        if line["kind"] == "det":
            assert line["det"]["labels"] == h["labels"] and line["det"]["width"] == h["width"]
    assert matched >= 0.9 * len(lines), (matched, len(lines))

    poses = doc_out.splitlines()
    # a frame's per-frame pose and a Sapiens2 keyframe of it share (topic, seq, track)
    ours_poses: dict[tuple[str, int, int], list[wire.Message]] = {}
    for (t, seq, _), msg in ours.items():
        if t.startswith("pose/"):
            ours_poses.setdefault((t, seq, msg.header["track_id"]), []).append(msg)
    assert poses, doc_err
    for line in poses:
        m = re.fullmatch(
            r"pose/(\w+) seq (\d+) track (\d+): 308 keypoints, nose at "
            r"\((-?\d+\.\d), (-?\d+\.\d)\), lag (\d+\.\d) ms",
            line,
        )
        assert m, line
        msgs = ours_poses.get((f"pose/{m[1]}", int(m[2]), int(m[3])), [])
        noses = [msg.arrays["keypoints"][0, :2] for msg in msgs]  # nose is keypoint 0
        # printed to 0.1 px (JS rounds ties up, Python to even: compare within 0.05)
        near = [abs(float(m[4]) - x) <= 0.0501 and abs(float(m[5]) - y) <= 0.0501 for x, y in noses]
        assert not msgs or any(near), (line, noses)


RIG = "yard"
RIG_CAMERAS = ["east", "north", "west", "south"]
# how long the Node.js subscriber listens once the first pose3d is out: a pose3d every 3 s of
# capture time once the four poses of its group are done (9.6 s of NPU2 at NPU2 pace)
MULTICAM_SECONDS = {"none": 8, "npu2": 24}


@pytest.fixture
def multicam_3d_config(tmp_path, free_port) -> tuple[Path, str]:
    """tests/standin_rig/multicam-3d.toml as kept, on its own free port, its calibration file found
    where the config keeps it: (path, endpoint). No bundle is found: the synthetic model."""
    endpoint = f"tcp://127.0.0.1:{free_port}"
    configs = REPO / "tests" / "standin_rig"
    text = (configs / "multicam-3d.toml").read_text()
    bind = 'bind = "tcp://127.0.0.1:5563"'
    calibration = 'calibration = "multicam-3d-calib.toml"'
    assert text.count(bind) == 1 and text.count(calibration) == 1
    text = text.replace(bind, f'bind = "{endpoint}"')
    text = text.replace(calibration, f'calibration = "{configs / "multicam-3d-calib.toml"}"')
    path = tmp_path / "multicam-3d.toml"
    path.write_text(text)
    return path, endpoint


def check_pose3d(msg: wire.Message) -> None:
    """One pose3d message against docs/protocol.md ("pose3d")."""
    h, a = msg.header, msg.arrays
    assert msg.topic == f"pose3d/{RIG}" and h["camera"] == h["rig"] == RIG
    assert h["cameras"] == RIG_CAMERAS and h["capture_ts_str"] == str(h["capture_ts"])
    p, k, v = h["count"], h["keypoints"], len(RIG_CAMERAS)
    assert k == 308 and [d["name"] for d in h["parts"]] == ["points", "error", "used"]
    assert a["points"].shape == (p, k, 4) and a["points"].dtype == np.float32
    assert a["error"].shape == (p, k) and a["error"].dtype == np.float32
    assert a["used"].shape == (p, k, v) and a["used"].dtype == np.uint8
    assert set(np.unique(a["used"])) <= {0, 1}
    assert len(h["person_ids"]) == len(h["tracks"]) == p
    assert all(isinstance(i, int) for i in h["person_ids"])
    for tracks in h["tracks"]:
        assert len(tracks) >= 2 and set(tracks) <= set(RIG_CAMERAS)
        assert all(isinstance(t, int) for t in tracks.values())
    assert set(h["views"]) | set(h["missing"]) == set(RIG_CAMERAS)
    assert not set(h["views"]) & set(h["missing"])
    assert all(isinstance(s, int) for s in h["views"].values())
    assert 0 <= h["skew_ns"] <= 100_000_000  # half the 5 fps period: the group tolerance
    assert h["skew_ms"] == round(h["skew_ns"] / 1e6, 3) and h["filtered"] is False
    xyz_missing = np.isnan(a["points"][..., :3]).any(-1)
    n_used = a["used"].sum(-1)
    assert (np.isnan(a["points"][..., :3]).all(-1) == xyz_missing).all()
    assert (xyz_missing == (a["points"][..., 3] == 0)).all()
    assert (xyz_missing == np.isnan(a["error"])).all()
    assert (n_used[xyz_missing] == 0).all() and (n_used[~xyz_missing] >= 2).all()
    assert (a["error"][~xyz_missing] <= 15.0).all()  # max_error_px
    if h["backend"] == "sim":
        assert h["synthetic"] is True and h["model"] == "sapiens2-synthetic"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("pacing", PACINGS)
def test_multicam_3d_publishes_pose3d_that_the_node_subscriber_decodes(
    multicam_3d_config, tmp_path, pacing
):
    node = shutil.which("node")
    assert node, "no node: run `make setup-test`"
    assert (EXAMPLE.parent / "node_modules" / "zeromq").is_dir(), "run `make setup-test`"
    config, endpoint = multicam_3d_config
    set_pacing(config, pacing)
    seconds = MULTICAM_SECONDS[pacing]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 100_000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    # the run lasts until the test has what it checks (SIGTERM then: exit 0); 300 s is a
    # hang guard. The Node.js subscriber starts once the first pose3d is out (the models'
    # warm-up, however long a loaded host takes) and listens `seconds`, time for more.
    run = subprocess.Popen(
        [str(NPUCAM), "run", str(config), "--duration", "300"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = (tmp_path / "node.jsonl").open("w")
    js = None
    received: list[wire.Message] = []

    def pose3d_count() -> int:
        return sum(m.header["kind"] == "pose3d" for m in received)

    try:
        end = time.monotonic() + 240  # a hang guard
        while run.poll() is None and time.monotonic() < end:
            if sub.poll(100):
                received.append(wire.decode(sub.recv_multipart()))
            if js is None and pose3d_count():
                js = node_subscriber(node, endpoint, seconds, out)
            if js is not None and js.poll() is not None and pose3d_count() >= 3:
                break
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        assert js is not None, "no pose3d message came"
        js_code = js.wait(timeout=60)
        js_err = js.stderr.read()
        run_err = run.stderr.read()
    finally:
        if js is not None:
            js.kill()
        out.close()
        run.kill()
        sub.close()
        ctx.term()
    assert run.returncode == 0, run_err[-3000:]
    assert js_code == 0 and "skipped" not in js_err, js_err
    pose3d = [m for m in received if m.header["kind"] == "pose3d"]
    assert len(pose3d) >= 3, run_err[-3000:]
    for msg in pose3d:
        check_pose3d(msg)
    seqs = [m.header["seq"] for m in pose3d]
    assert seqs == sorted(set(seqs))  # groups leave in capture order, one message each
    # every view names its frame: join it with that camera's det message
    dets = {(m.header["camera"], m.header["seq"]) for m in received if m.topic.startswith("det/")}
    first = {c: min((s for cam, s in dets if cam == c), default=None) for c in RIG_CAMERAS}
    for msg in pose3d:
        for camera, seq in msg.header["views"].items():
            if first[camera] is not None and seq >= first[camera]:
                assert (camera, seq) in dets, (camera, seq)
    (meta,) = {json.dumps(m.header["meta"]) for m in received if m.topic == "meta"}
    meta = json.loads(meta)
    assert meta["rigs"] == [{"rig": RIG, "cameras": RIG_CAMERAS, "stage": "rig3d"}]
    assert meta["pose3d"]["columns"] == ["x", "y", "z", "confidence"]

    ours = {(m.topic, m.header["seq"], str(m.header["publish_ts"])): m for m in received}
    lines = [json.loads(line) for line in (tmp_path / "node.jsonl").read_text().splitlines()]
    node_pose3d = [line for line in lines if line["kind"] == "pose3d"]
    assert node_pose3d, js_err
    meta_lines = [line for line in lines if line["kind"] == "meta"]
    assert meta_lines and meta_lines[0]["meta"]["rigs"] == meta["rigs"]
    matched = 0
    for line in node_pose3d:
        msg = ours.get((line["topic"], line["seq"], line["publish_ts"]))
        if msg is None:
            continue
        matched += 1
        assert line["ts_exact"]
        assert_parts_decoded(line, msg)
        h, got = msg.header, line["pose3d"]
        assert (got["rig"], got["cameras"], got["count"], got["P"]) == (
            RIG,
            RIG_CAMERAS,
            h["count"],
            h["count"],
        )
        assert got["keypoints"] == got["meta_count"] == 308 and got["rig_cameras"] == RIG_CAMERAS
        assert (got["views"], got["missing"], got["skew_ns"]) == (
            h["views"],
            h["missing"],
            h["skew_ns"],
        )
        points, used = msg.arrays["points"], msg.arrays["used"]
        for p, person in enumerate(got["people"]):
            assert person["id"] == h["person_ids"][p] and person["tracks"] == h["tracks"][p]
            assert person["triangulated"] == int(np.isfinite(points[p, :, 0]).sum())
            assert person["views"] == int(used[p].sum())
    assert matched >= 0.8 * len(node_pose3d), (matched, len(node_pose3d))
