"""docs/examples/subscriber.mjs, the Node.js subscriber of docs/protocol.md, against the demo:
it decodes every kind, and each value it prints (dtype, shape, leading values, sums, exact ns
timestamps, the JPEG's own size) equals what pipeline.wire decodes from the same message. The
shorter Node.js example in docs/protocol.md runs beside it and prints the poses."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from pipeline import wire

REPO = Path(__file__).resolve().parents[3]
NPUCAM = Path(sys.executable).parent / "npucam"
EXAMPLE = REPO / "docs" / "examples" / "subscriber.mjs"
KINDS = {"det", "pose", "face", "clip", "stats", "meta", "preview"}
NODE_SECONDS = 18


def sequential_sum(values) -> float:
    """Left-to-right float64 sum, the order the example adds in."""
    total = 0.0
    for v in values:
        total += float(v)
    return total


@pytest.mark.timeout(120)
def test_the_node_subscriber_decodes_every_kind_as_pipeline_wire_does(demo_config, tmp_path):
    node = shutil.which("node")
    assert node, "no node: run `make setup-test`"
    assert (EXAMPLE.parent / "node_modules" / "zeromq").is_dir(), "run `make setup-test`"
    config, endpoint = demo_config
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
        [str(NPUCAM), "run", str(config), "--duration", "60"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = (tmp_path / "node.jsonl").open("w")
    js = subprocess.Popen(
        [node, str(EXAMPLE), endpoint, "--seconds", str(NODE_SECONDS)],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.PIPE,
        text=True,
    )
    doc_js = subprocess.Popen(
        [node, str(doc_example), endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # (topic, seq, publish_ts) names one message: a frame can have several poses, faces, labels
    ours: dict[tuple[str, int, str], wire.Message] = {}
    try:
        end = time.monotonic() + NODE_SECONDS + 10
        while js.poll() is None and time.monotonic() < end:
            if sub.poll(100):
                msg = wire.decode(sub.recv_multipart())
                ours[msg.topic, msg.header["seq"], str(msg.header["publish_ts"])] = msg
        js_code = js.wait(timeout=10)
        js_err = js.stderr.read()
    finally:
        js.kill()
        doc_js.kill()
        doc_out, doc_err = doc_js.communicate(timeout=10)
        out.close()
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=15)
        sub.close()
        ctx.term()
    assert js_code == 0, js_err
    assert "skipped" not in js_err, js_err
    lines = [json.loads(line) for line in (tmp_path / "node.jsonl").read_text().splitlines()]
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
        assert (line["capture_ts"], line["publish_ts"]) == (
            str(h["capture_ts"]),
            str(h["publish_ts"]),
        )
        assert line["lag_ms"] == pytest.approx((h["publish_ts"] - h["capture_ts"]) / 1e6, abs=1e-6)
        assert set(line["parts"]) == set(msg.arrays)
        for name, got in line["parts"].items():
            a = msg.arrays[name]
            assert (got["dtype"], got["shape"], got["n"]) == (a.dtype.name, list(a.shape), a.size)
            assert got["head"] == [float(v) for v in a.ravel()[:6].tolist()], (line["topic"], name)
            assert got["sum"] == sequential_sum(a.ravel().tolist()), (line["topic"], name)
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
    ours_poses = {
        (t, seq, msg.header["track_id"]): msg
        for (t, seq, _), msg in ours.items()
        if t.startswith("pose/")
    }
    assert poses, doc_err
    for line in poses:
        m = re.fullmatch(
            r"pose/(\w+) seq (\d+) track (\d+): 308 keypoints, nose at "
            r"\((-?\d+\.\d), (-?\d+\.\d)\), lag (\d+\.\d) ms",
            line,
        )
        assert m, line
        msg = ours_poses.get((f"pose/{m[1]}", int(m[2]), int(m[3])))
        if msg is not None:
            x, y = msg.arrays["keypoints"][0, :2]  # nose is keypoint 0
            # printed to 0.1 px (JS rounds ties up, Python to even: compare within 0.05)
            assert abs(float(m[4]) - x) <= 0.0501 and abs(float(m[5]) - y) <= 0.0501, line
