"""Hostile external-detector box messages (detect's person = "zmq"; issue 18, findings 4, 5).

4. A box message holding a 5000-digit integer used to kill the receiver thread (an uncaught
   ValueError from Python's int-string limit); every frame then had 0 persons, no drop
   counted. Now the message is refused and counted (`boxes_malformed` on stats, an `error`
   drop) and the next message is served; a receiver thread that dies anyway for another
   reason is noticed by detect, which fails each frame as an `error` drop and says why.
5. One message of 1000 identical boxes stalled detect (every camera) 7.8 s: the tracker's
   assignment was cubic in the box count. Now a message over boxes_max_per_message (256) is
   refused, and the tracker's assignment is solved per group of overlapping boxes in C
   (stages.tracker.match_by_iou), so 256 identical boxes cost milliseconds: the other camera
   keeps streaming throughout (its rate and longest gap against a run with one box: the
   `slow` test).

Issue 33: a box [1e38, 1e38, 3e38, 3e38] has values float32 holds, but x + w and y + h do not
(inf): it was accepted and every frame of its camera failed in detect, uncounted. Now the
corners are checked too and the message is refused like any malformed one.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import zmq
from engine_stages import start
from rel_helpers import Recorder

from pipeline.messages import now_ns
from stages.box_receiver import BoxReceiver


def config(write_config, endpoint: str) -> str:
    return write_config(
        f"""
        [metrics]
        stats_interval_s = 0.2
        [[cameras]]
        name = "card"
        url = "synthetic:?width=64&height=48&fps=25"
        [[cameras]]
        name = "card2"
        url = "synthetic:?width=64&height=48&fps=25"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "detect"
        person = "zmq"
        boxes_endpoint = "{endpoint}"
        boxes_max_age_ms = 100000
        face = "none"
        pose = false
        inbox = {{ size = 2, policy = "latest" }}
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        """
    )


def box_message(n: int = 1, camera: str = "card") -> bytes:
    return json.dumps(
        {"camera": camera, "boxes": [[4, 4, 20, 30]] * n, "scores": [0.9] * n}
    ).encode()


async def run(path, endpoint: str, script):
    """Start a PUB on endpoint (the detect stage's boxes_endpoint) and the pipeline, then
    `script(pub, rec)`; returns (exit code, recorder, last stats)."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        pub.bind(endpoint)
    except zmq.ZMQError:
        pub.close(0)
        ctx.term()
        raise
    pipeline, task = await start(path)
    try:
        await asyncio.wait_for(pipeline.stages["publish"].bound.wait(), 5)
        rec = await Recorder(pipeline.stages["publish"].endpoint).start()
        await rec.wait_for(lambda: len(rec.frames("card2")) >= 5, 10, "card2 streaming")
        await script(pub, rec)
        # a stats message that arrives after what the script saw was sent after it on the same
        # socket, so its snapshot holds what the script waited for
        seen = len(rec.stats())
        await rec.wait_for(lambda: len(rec.stats()) > seen, 20, "stats after the script")
        last = rec.stats()[-1].header["stats"]
    finally:
        pipeline.stop()
        code = await asyncio.wait_for(task, 10)
        pub.close(0)
        ctx.term()
    await rec.stop(idle_s=0.1)
    return code, rec, last


def persons(rec: Recorder, camera: str) -> list[int]:
    return [s.header["labels"].count("person") for s in rec.frames(camera)]


def detect_errors(rec: Recorder, camera: str) -> int:
    """The camera's `error` drops of detect in the newest stats message (0 before any)."""
    stats = rec.stats()
    drops = stats[-1].header["stats"]["stages"].get("detect", {}).get("drops", {}) if stats else {}
    return drops.get(camera, {}).get("error", 0)


async def served(rec: Recorder, camera: str, count: int, timeout: float = 10) -> None:
    """Wait until the camera's newest det holds `count` persons."""
    await rec.wait_for(
        lambda: rec.frames(camera) and persons(rec, camera)[-1] == count,
        timeout,
        f"{count} persons on {camera}",
    )


def test_a_5000_digit_integer_is_refused_counted_and_the_receiver_serves_on(
    write_config, free_port
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = config(write_config, endpoint)

    async def script(pub, rec):
        await asyncio.sleep(0.5)  # the SUB has joined
        pub.send(box_message(1))
        await served(rec, "card", 1)
        huge = b'{"camera": "card", "boxes": [[' + b"9" * 5000 + b", 1, 2, 3]]}"
        pub.send(huge)
        await asyncio.sleep(0.3)
        pub.send(box_message(2))
        await served(rec, "card", 2)

    code, rec, last = asyncio.run(run(path, endpoint, script))
    assert code == 0
    gauges = last["stages"]["detect"]["gauges"]
    assert gauges["boxes_malformed"] == 1 and gauges["box_receiver_alive"] == 1
    assert gauges["boxes_received"] == 2  # the two valid messages, each once
    assert last["stages"]["detect"]["drops"][""]["error"] == 1  # it names no camera it can read


def test_a_receiver_thread_that_dies_anyway_is_reported_on_every_frame(
    write_config, free_port, monkeypatch, caplog
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = config(write_config, endpoint)
    real = BoxReceiver._receive_once
    calls = {"n": 0}

    def dies_after_a_while(self, poller):
        calls["n"] += 1
        if calls["n"] > 15:  # ~1.5 s of 100 ms polls
            raise RuntimeError("a bug outside message handling")
        return real(self, poller)

    monkeypatch.setattr(BoxReceiver, "_receive_once", dies_after_a_while)

    async def script(pub, rec):
        await rec.wait_for(
            lambda: calls["n"] > 15 and len(rec.stats()) >= 2, 10, "the receiver died"
        )
        # from then on every frame of card fails: the count goes on (a hang guard: it returns
        # once five have)
        await rec.wait_for(lambda: detect_errors(rec, "card") >= 5, 20, "5 failed frames of card")

    with caplog.at_level("ERROR"):
        code, rec, last = asyncio.run(run(path, endpoint, script))
    assert code == 0
    gauges = last["stages"]["detect"]["gauges"]
    assert gauges["box_receiver_alive"] == 0
    assert last["stages"]["detect"]["drops"]["card"]["error"] >= 5  # each frame, counted
    assert any("box receiver" in r.getMessage() and "stopped" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert rec.frames("card2")  # det of card2 flowed until then


def test_1000_identical_boxes_are_refused_and_256_never_stall_the_other_camera(
    write_config, free_port
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = config(write_config, endpoint)
    at: dict[str, int] = {}  # how many det messages of each camera had arrived at two points

    async def script(pub, rec):
        await asyncio.sleep(0.5)
        pub.send(box_message(1000))  # over boxes_max_per_message: refused
        await asyncio.sleep(0.5)
        pub.send(box_message(256))  # at the limit: tracked, 256 tracks
        await served(rec, "card", 256)
        at.update(card=len(rec.frames("card")), card2=len(rec.frames("card2")))
        # 256 identical boxes on every frame of card for ten more of its frames; a detect
        # stalled by them would take seconds a frame (the wait's timeout, a hang guard)
        await rec.wait_for(
            lambda: len(rec.frames("card")) >= at["card"] + 10, 20, "ten more frames of card"
        )
        at["card2_after"] = len(rec.frames("card2"))

    code, rec, last = asyncio.run(run(path, endpoint, script))
    assert code == 0
    gauges = last["stages"]["detect"]["gauges"]
    assert gauges["boxes_malformed"] == 1  # the 1000-box message
    assert max(persons(rec, "card")) == 256
    assert set(persons(rec, "card")[at["card"] :]) == {256}  # on every frame since
    # the other camera kept being served meanwhile, in order; how fast is the host's speed
    # (against a run with one box: the slow test below)
    assert at["card2_after"] > at["card2"]
    seqs = [s.header["seq"] for s in rec.frames("card2")]
    assert seqs == sorted(set(seqs))


async def other_camera_flow(path, endpoint: str, boxes: int, seconds: float) -> list[float]:
    """Run the pipeline with `boxes` identical boxes on every frame of card; the arrival times
    (s) of card2's det messages over `seconds` of wall time once card's frames carry them,
    with the window's two ends first and last."""
    window: list[float] = []

    async def script(pub, rec):
        await asyncio.sleep(0.5)  # the SUB has joined
        pub.send(box_message(boxes))
        await served(rec, "card", boxes)
        t0 = now_ns()  # the recorder's clock
        await asyncio.sleep(seconds)
        t1 = now_ns()
        times = [s.received_ns for s in rec.frames("card2") if t0 <= s.received_ns <= t1]
        window.extend(t / 1e9 for t in (t0, *times, t1))

    code, _, last = await run(path, endpoint, script)
    assert code == 0 and last["stages"]["detect"]["gauges"]["boxes_malformed"] == 0
    return window


@pytest.mark.slow  # the other camera's rate and gaps on the wall clock: never in the default run
def test_256_identical_boxes_keep_the_other_camera_near_its_rate_with_one_box(
    write_config, free_port
):
    # Two runs back to back, sharing the host's load: the control puts one box on card's
    # frames, then 256 identical ones. Before the tracker's assignment was solved per group
    # in C, 1000 boxes stalled detect (every camera) 7.8 s a frame. Measured on 2 cores, idle
    # or with both busy: card2 at 25.0 / 24.7 a second, longest gap 0.04-0.055 / 0.06 s.
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = config(write_config, endpoint)
    flows = {n: asyncio.run(other_camera_flow(path, endpoint, n, 4.0)) for n in (1, 256)}
    rate = {n: (len(w) - 2) / (w[-1] - w[0]) for n, w in flows.items()}
    gap = {n: max(b - a for a, b in zip(w, w[1:], strict=False)) for n, w in flows.items()}
    print(
        f"card2 with 1 / 256 boxes on card: {rate[1]:.1f} / {rate[256]:.1f} det a second, "
        f"longest gap {gap[1]:.3f} / {gap[256]:.3f} s"
    )
    assert rate[256] >= 0.8 * rate[1], rate
    assert gap[256] <= 3 * gap[1], gap


def test_a_message_far_over_the_byte_limit_drops_the_link_and_the_receiver_reconnects(
    write_config, free_port
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = config(write_config, endpoint)

    async def script(pub, rec):
        await asyncio.sleep(0.5)
        pub.send(box_message(1))
        await served(rec, "card", 1)
        pub.send(b"x" * (3 << 20))  # 3 MiB: libzmq drops the connection (ZMQ_MAXMSGSIZE)
        for _ in range(100):  # until the receiver has reconnected and the PUB knows it again
            pub.send(box_message(3))
            if rec.frames("card") and persons(rec, "card")[-1] == 3:
                break
            await asyncio.sleep(0.1)
        await served(rec, "card", 3)

    code, rec, last = asyncio.run(run(path, endpoint, script))
    assert code == 0
    gauges = last["stages"]["detect"]["gauges"]
    assert gauges["boxes_reconnects"] >= 1 and gauges["box_receiver_alive"] == 1


def test_a_box_whose_corner_overflows_float32_is_refused_and_counted(free_port):
    malformed = []
    receiver = BoxReceiver(f"tcp://127.0.0.1:{free_port}", ["card"], malformed.append)
    try:
        overflow = json.dumps({"camera": "card", "boxes": [[1e38, 1e38, 3e38, 3e38]]}).encode()
        assert receiver.handle(overflow) is None
        assert receiver.malformed == 1 and malformed == ["card"]
        good = receiver.handle(box_message())
        assert good is not None and receiver.received == 1
        corners = good.boxes[:, :2] + good.boxes[:, 2:]
        assert np.isfinite(corners).all()
    finally:
        receiver.close()
