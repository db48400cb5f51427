"""Publish end to end: file cameras -> ZeroMQ PUB -> an in-test SUB, the stats and preview
topics, subscription notifications read while subscribers come and go, and frames PUSHed
to a `zmq:` camera of a second pipeline."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
import zmq
from engine_stages import run_and_receive, start, until

from pipeline import wire


def test_two_file_cameras_reach_a_subscriber_with_monotonic_seq_and_valid_headers(
    write_config,
):
    path = write_config(
        """
        [metrics]
        stats_interval_s = 0.5
        [[cameras]]
        name = "bikes"
        url = "sample:bikes.mp4"
        realtime = false
        staleness_ms = 60000
        [[cameras]]
        name = "carphone"
        url = "sample:carphone_pristine.mp4"
        realtime = false
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        inbox = { size = 8, policy = "block" }
        """
    )

    _, code, raw = run_and_receive(path, duration=20, until_idle_s=2.0)
    messages = [wire.decode(m) for m in raw]
    assert code == 0
    det = {"bikes": [], "carphone": []}
    stats = []
    assert messages[0].topic == "meta"  # what every new subscriber receives first
    assert [m.topic for m in messages].count("meta") == 1
    for m in messages[1:]:
        h = m.header
        if m.topic == "stats":
            stats.append(h)
            continue
        assert m.topic == f"det/{h['camera']}" and h["kind"] == "det"
        assert h["capture_ts"] <= h["publish_ts"]
        assert (h["backend"], h["model"], h["synthetic"], h["count"]) == ("none", "none", False, 0)
        assert m.arrays["boxes"].shape == (0, 4) and m.arrays["boxes"].dtype == np.float32
        det[h["camera"]].append(h)
    assert [h["seq"] for h in det["bikes"]] == list(range(250))  # every frame of the clips
    assert [h["seq"] for h in det["carphone"]] == list(range(120))
    assert {(h["width"], h["height"]) for h in det["bikes"]} == {(640, 272)}
    assert {(h["width"], h["height"]) for h in det["carphone"]} == {(176, 144)}
    final = stats[-1]["stats"]  # sent after the drain: the run's totals
    assert final["stages"]["publish"]["out"] == {"bikes": 250, "carphone": 120}
    assert final["cameras"]["bikes"]["health"] == "ended"


def test_preview_topic_carries_a_decodable_jpeg(write_config):
    path = write_config(
        """
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "card"
        url = "synthetic:?width=320&height=240&fps=30"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        frame_meta = false
        preview = true
        preview_max_width = 160
        wait_for_subscribers = 1
        """
    )

    _, code, raw = run_and_receive(path, duration=1.0, topic="preview/")
    messages = [wire.decode(m) for m in raw]
    assert code == 0
    assert messages and all(m.topic == "preview/card" for m in messages)
    m = messages[0]
    assert m.header["parts"][0]["encoding"] == "jpeg"
    image = cv2.imdecode(m.arrays["jpeg"], cv2.IMREAD_COLOR)
    assert image.shape == (120, 160, 3) == (m.header["height"], m.header["width"], 3)


def test_frames_pushed_by_one_pipeline_arrive_at_a_zmq_camera_of_another(write_config, free_port):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    capture = _push_config(write_config, endpoint, 64, 48, 50)
    infer = write_config(
        f"""
        [[cameras]]
        name = "remote"
        url = "zmq:{endpoint}"
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "sink"
        kind = "engine_stages:Collect"
        """,
        name="infer.toml",
    )

    async def main():
        sender, send_task = await start(capture, duration=1.5)
        receiver, recv_task = await start(infer, duration=1.5)
        return sender, receiver, await send_task, await recv_task

    sender, receiver, code_s, code_r = asyncio.run(main())
    assert (code_s, code_r) == (0, 0)
    got = receiver.stages["sink"].items
    assert len(got) > 20
    assert all(f.camera == "remote" and f.image.shape == (48, 64, 3) for f in got)
    pushed = sender.metrics.items_out["zmq_push", "card"]
    # dropped at the inbox (queue_full) or at the source because the receiver was behind
    lost = sender.metrics.dropped("zmq_push", "card")
    assert pushed >= len(got) and pushed + lost == sender.metrics.items_in["zmq_push", "card"]
    # each frame keeps the sender's seq: in order, and a gap is a drop counted on one side
    seqs = [f.seq for f in got]
    assert seqs == sorted(set(seqs))
    assert seqs[-1] - seqs[0] + 1 - len(seqs) <= lost + receiver.metrics.dropped(camera="remote")


def test_the_protocol_docs_subscriber_example_reads_what_publish_sends(write_config, tmp_path):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    example = tmp_path / "subscriber.py"
    example.write_text(re.search(r"```python\n(.*?)```", doc, re.S).group(1))
    path = write_config(
        """
        [[cameras]]
        name = "card"
        url = "synthetic:?width=96&height=64&fps=30"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        """
    )

    async def main():
        pipeline, task = await start(path, duration=8.0)
        await asyncio.wait_for(pipeline.stages["publish"].bound.wait(), 5)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(example),
            pipeline.stages["publish"].endpoint,
            stdout=asyncio.subprocess.PIPE,
        )
        lines = [(await asyncio.wait_for(proc.stdout.readline(), 5)).decode() for _ in range(3)]
        proc.kill()
        await proc.wait()
        pipeline.stop()
        return await task, lines

    code, lines = asyncio.run(main())
    assert code == 0
    for line in lines:
        assert re.fullmatch(r"det/card \d+ 96x64 0 boxes lag \d+\.\d ms\n", line), line


def test_subscription_notifications_are_read_while_subscribers_come_and_go(write_config):
    """With wait_for_subscribers = 0 each subscribe and unsubscribe that libzmq queues on the
    XPUB is read (else they pile up for the life of the process): one subscriber at a time,
    so every connect queues one subscribe and every disconnect one unsubscribe."""
    path = write_config(
        """
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "card"
        url = "synthetic:?width=32&height=24&fps=10"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        """
    )
    cycles = 10

    async def read_count_reaches(publish, n: int, timeout_s: float = 5.0) -> bool:
        end = time.monotonic() + timeout_s
        while publish.subscription_messages < n and time.monotonic() < end:
            await asyncio.sleep(0.01)
        return publish.subscription_messages == n

    async def main():
        pipeline, task = await start(path, duration=30)
        publish = pipeline.stages["publish"]
        await asyncio.wait_for(publish.bound.wait(), 5)
        ctx = zmq.Context()
        reached = []
        try:
            for i in range(cycles):
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt(zmq.SUBSCRIBE, b"det/")
                sub.connect(publish.endpoint)
                reached.append(await read_count_reaches(publish, 2 * i + 1))
                sub.close()
                reached.append(await read_count_reaches(publish, 2 * i + 2))
        finally:
            ctx.term()
            pipeline.stop()
        return await task, reached, publish.subscription_messages

    code, reached, read = asyncio.run(main())
    assert code == 0
    assert read == 2 * cycles and all(reached), reached


def test_a_camera_whose_topics_exceed_max_subscription_bytes_is_a_config_error(write_config):
    from pipeline.config import ConfigError, load_config
    from pipeline.graph import check_stages

    name = "c" * 57  # preview/<name> is 65 bytes, over the default 64
    path = write_config(
        f'[[cameras]]\nname = "{name}"\nurl = "synthetic:"\n'
        '[[stages]]\nkind = "capture"\n[[stages]]\nkind = "publish"\n'
    )
    with pytest.raises(ConfigError, match=r"cameras\[0\].name: topic preview/c+ is longer than"):
        check_stages(load_config(path))
    raised = path.read_text().replace(
        'kind = "publish"', 'kind = "publish"\nmax_subscription_bytes = 65'
    )
    path.write_text(raised)
    check_stages(load_config(path))


def _push_config(write_config, endpoint: str, width: int, height: int, fps: int) -> Path:
    return write_config(
        f"""
        [[cameras]]
        name = "card"
        url = "synthetic:?width={width}&height={height}&fps={fps}"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "zmq_push"
        bind = "{endpoint}"
        format = "raw"
        """,
        name="capture.toml",
    )


def pushed(sender) -> int:
    """Frames the zmq_push stage of the sending pipeline has sent."""
    return sender.metrics.items_out.get(("zmq_push", "card"), 0)  # no key added meanwhile


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """until() for a test's own thread, off any event loop."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _zmq_camera(endpoint: str, emit):
    from stages.sources import CameraReader, CameraSpec

    spec = CameraSpec("remote", f"zmq:{endpoint}", staleness_ms=10_000, stall_timeout_s=30)
    reader = CameraReader(spec, emit)
    reader.start()
    return reader


def test_a_raw_frame_over_the_split_is_bit_identical_and_received_without_a_copy(
    write_config, free_port
):
    from stages.source_kinds.synthetic import synthetic_image

    endpoint = f"tcp://127.0.0.1:{free_port}"
    got = []
    # 640x480x3 = 921,600 bytes: above pyzmq's copy threshold, so the zero-copy path is used.
    reader = _zmq_camera(endpoint, got.append)
    try:

        async def main():
            sender, task = await start(_push_config(write_config, endpoint, 640, 480, 30))
            # until 10 frames were pushed, however long this host takes
            await until(lambda: pushed(sender) >= 10, "10 frames pushed")
            sender.stop()
            return sender, await task

        sender, code = asyncio.run(main())
        wait_until(lambda: len(got) >= pushed(sender), "the frames sent to be received")
    finally:
        reader.stop()
    assert code == 0 and len(got) == pushed(sender) >= 10
    for frame in got:
        # The card's frame seq is a function of seq alone, and the sender's seq is kept.
        np.testing.assert_array_equal(frame.image, synthetic_image(frame.seq, 640, 480))
        # A view of the received message's memory (no copy), and writable.
        assert not frame.image.flags.owndata and frame.image.flags.writeable


def test_a_stalled_receiver_makes_the_sender_drop_at_the_source_and_lag_stays_bounded(
    write_config, free_port
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    captured: list[int] = []  # capture times of the frames the receiver got, in order
    stall: list[int] = []  # [start, end] of the receiver's stall, on the capture clock
    stall_s = 1.0

    def emit(frame):
        captured.append(frame.capture_ts_ns)
        if len(captured) == 5:
            stall.append(time.time_ns())
            time.sleep(stall_s)  # the receiver stops reading: its socket and buffers fill
            stall.append(time.time_ns())

    reader = _zmq_camera(endpoint, emit)
    try:

        async def main():
            # 100 frames/s of 921,600 bytes for 3 s; ~100 frames offered during the stall.
            sender, task = await start(_push_config(write_config, endpoint, 640, 480, 100), 3)
            return sender, await task

        sender, code = asyncio.run(main())
    finally:
        reader.stop()
    assert code == 0 and len(stall) == 2
    m = sender.metrics
    slow = m.dropped("zmq_push", "card", "peer_slow")
    assert slow > 0  # frames offered during the stall were dropped at the source
    # every frame the stage took was sent or dropped at the source; frames its full inbox
    # dropped (`queue_full`, a loaded host: 2 at load 9) were never taken
    assert m.items_in["zmq_push", "card"] == m.items_out["zmq_push", "card"] + slow
    # Of the frames captured during the stall, the receiver gets only what the buffers held
    # (sndhwm 2 + RCVHWM 1 + the kernels' TCP buffers, ~5 frames of 900 KB): the rest were
    # dropped at the source, however many a host of any speed offered; and the stream goes on
    # with frames captured after it.
    during = [t for t in captured[5:] if stall[0] <= t <= stall[1]]
    assert len(during) <= 14, len(during)
    # wall-clock-ok: the order of two stamps: a frame captured after the stall ended
    assert any(t > stall[1] for t in captured)
