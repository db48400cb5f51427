"""Preview frames: the tap follows preview/ subscriptions per camera and rate-limits on the
capture clock; with a detect stage, JPEGs are published only while a subscriber wants them;
a publish stage that no frame can reach warns at start."""

from __future__ import annotations

import asyncio
import logging
import time

import cv2
import zmq
from engine_stages import start, subscriber

from pipeline import wire
from pipeline.config import parse_config
from pipeline.graph import Context
from pipeline.metrics import Metrics
from stages.preview import PreviewTap, frame_producers
from stages.publish import Publish, PublishOptions

NS = 1_000_000_000


def test_the_tap_counts_only_subscriptions_that_match_a_preview_topic_of_the_run():
    tap = PreviewTap(5.0, ["bikes", "carphone"])
    tap.subscription(True, b"det/")
    tap.subscription(True, b"preview/zebra")  # no such camera: matches nothing published
    tap.subscription(True, b"\xff")  # not UTF-8: matches nothing
    assert tap.viewers == 0 and not tap.wanted("bikes")
    tap.subscription(True, b"preview/bi")
    assert tap.wanted("bikes") and not tap.wanted("carphone")
    tap.subscription(True, b"preview/bi")  # a second subscriber of the same prefix
    tap.subscription(False, b"preview/bi")
    assert tap.wanted("bikes")
    tap.subscription(False, b"preview/bi")
    assert not tap.wanted("bikes")
    tap.subscription(True, b"")  # everything, previews included
    assert tap.wanted("bikes") and tap.wanted("carphone") and tap.viewers == 1
    tap.subscription(False, b"")
    tap.subscription(False, b"pre")  # an unsubscribe never seen subscribed does not go below 0
    assert tap.viewers == 0 and not tap.wanted("carphone")


def test_the_tap_rate_limits_each_camera_on_the_capture_clock():
    tap = PreviewTap(4.0, ["a", "b"])
    assert not tap.due("a", 0)  # no viewer
    tap.subscription(True, b"preview/")
    times = [i * NS // 20 for i in range(40)]  # 20 fps for 2 s
    assert sum(tap.due("a", t) for t in times) == 8  # 4 a second
    assert tap.due("b", times[-1])  # each camera has its own clock


DETECT_CONFIG = """
    [metrics]
    stats_interval_s = 0
    [[cameras]]
    name = "card"
    url = "synthetic:?width=320&height=240&fps=30"
    [[stages]]
    kind = "capture"
    [[stages]]
    kind = "detect"
    person = "none"
    face = "none"
    pose = false
    to = ["publish"]
    inbox = { size = 2, policy = "latest" }
    [[stages]]
    kind = "publish"
    bind = "tcp://127.0.0.1:*"
    preview = true
    preview_fps = 10
    preview_max_width = 160
    """


async def drain(sock, seconds: float) -> list[wire.Message]:
    got: list[wire.Message] = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if await sock.poll(int(left * 1000) + 1):
            got.append(wire.decode(await sock.recv_multipart()))
    return got


async def receive_n(sock, n: int, timeout: float = 30.0) -> list[wire.Message]:
    """The first n messages, however long this host takes to send them; `timeout` only bounds
    a hang (the test then fails saying how many came)."""
    got: list[wire.Message] = []
    while len(got) < n:
        assert await sock.poll(int(timeout * 1000)), f"{len(got)} of {n} messages"
        got.append(wire.decode(await sock.recv_multipart()))
    return got


def test_with_a_detect_stage_previews_flow_only_while_someone_subscribes_to_them(write_config):
    path = write_config(DETECT_CONFIG)

    async def main():
        pipeline, task = await start(path, duration=30)
        publish = pipeline.stages["publish"]
        det_only = await subscriber(pipeline, topic="det/")
        await asyncio.sleep(1.0)
        before = await drain(det_only, 0.5)
        viewers_before = publish.tap.viewers
        viewer = await subscriber(pipeline, topic="preview/")
        seen = await receive_n(viewer, 8)
        viewers_during = publish.tap.viewers
        viewer.setsockopt(zmq.UNSUBSCRIBE, b"preview/")
        await asyncio.sleep(0.5)  # the unsubscribe reaches publish within its drain period
        viewers_after = publish.tap.viewers
        viewer.setsockopt(zmq.SUBSCRIBE, b"det/")  # still connected: would see previews
        await drain(viewer, 0.3)
        after = [m for m in await drain(viewer, 1.0) if m.topic.startswith("preview/")]
        det_only.close()
        viewer.close()
        pipeline.stop()
        return await task, before, seen, after, (viewers_before, viewers_during, viewers_after)

    code, before, seen, after, viewers = asyncio.run(main())
    assert code == 0
    assert viewers == (0, 1, 0)
    assert before and all(m.topic == "det/card" for m in before)  # det flows, no preview
    previews = [m for m in seen if m.topic == "preview/card"]
    assert len(previews) == len(seen)  # the viewer's subscription: previews only
    seqs = [m.header["seq"] for m in previews]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # 10 a second on the capture clock, from frames at 30: no two previews closer than 0.1 s
    # of capture time (the count in a fixed wall-clock span was this host's speed)
    stamps = [m.header["capture_ts"] for m in previews]
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    # wall-clock-ok: a spacing the tap enforces on the frames' capture stamps (PreviewTap.due),
    # not a count over the sleeps above: a slow host spaces previews more, never less
    assert all(g >= NS // 10 for g in gaps), gaps
    image = cv2.imdecode(previews[0].arrays["jpeg"], cv2.IMREAD_COLOR)
    assert image.shape == (120, 160, 3)
    assert (previews[0].header["width"], previews[0].header["height"]) == (160, 120)
    assert after == []  # nobody wants them any more: none encoded or sent


def config_of(stages: list[dict], tmp_path):
    cameras = [{"name": "card", "url": "synthetic:"}]
    return parse_config({"cameras": cameras, "stages": stages}, tmp_path / "run.toml")


def test_frame_producers_are_the_sources_and_frame_stages_that_send_to_publish(tmp_path):
    config = config_of(
        [
            {"kind": "capture", "to": ["detect", "publish"]},
            {"kind": "detect", "to": ["align", "publish"]},
            {"kind": "align", "to": ["dark"]},
            {"kind": "dark", "to": ["publish"]},
            {"kind": "publish"},
        ],
        tmp_path,
    )
    assert frame_producers(config, 4) == ["capture", "detect"]
    assert frame_producers(config, 3) == []


def test_preview_where_no_frame_reaches_publish_warns_at_start(tmp_path, caplog):
    config = config_of(
        [
            {"kind": "capture", "to": ["align"]},
            {"kind": "align", "to": ["dark"]},
            {"kind": "dark", "to": ["publish"]},
            {"kind": "publish", "preview": True},
        ],
        tmp_path,
    )
    publish = Publish("publish", PublishOptions(preview=True), Context(config, Metrics()))
    with caplog.at_level(logging.WARNING, "stages.publish"):
        publish._warn_if_no_previews()
    assert "preview = true, but no stage sends it frames" in caplog.text
