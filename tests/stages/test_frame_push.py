"""zmq_push flow control (stages/frame_push.py): while the peer cannot take a frame, the newest
frame of each camera waits and the one it replaces is counted `peer_slow`; the waiting frames
go out, the longest-waiting camera first, once a peer can take them; at the end what could
not be sent is counted, so every frame taken is either sent or dropped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import zmq

from pipeline.config import parse_config
from pipeline.graph import Context
from pipeline.messages import Frame, now_ns
from pipeline.metrics import Metrics
from pipeline.queues import ThreadInbox
from stages.frame_push import FramePush, FramePushOptions


def _frame(camera: str, seq: int) -> Frame:
    t = now_ns()
    return Frame(camera, seq, t, t + 60 * 10**9, np.full((4, 6, 3), seq, np.uint8), "test")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.02)


def test_the_newest_frame_per_camera_waits_for_the_peer_and_the_rest_are_counted(free_port):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    stages = [{"name": "push", "kind": "zmq_push", "bind": endpoint}]
    config = parse_config({"stages": stages}, Path("t.toml"))
    metrics = Metrics()
    options = FramePushOptions(bind=endpoint, format="raw", linger_ms=200)
    stage = FramePush("push", options, Context(config, metrics))

    async def main() -> list[tuple[str, int]]:
        inbox = ThreadInbox("push", 8, "drop_oldest", metrics)
        inbox.add_producer()
        task = asyncio.create_task(stage.run(inbox, None))
        bound = asyncio.ensure_future(stage.bound.wait())
        await asyncio.wait([task, bound], timeout=5, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # the stage failed to start: its error
        # No peer yet: nothing can be sent, so each camera's newest frame waits.
        for camera, seq in (("a", 0), ("b", 0), ("a", 1), ("a", 2), ("b", 1)):
            inbox.put_nowait(_frame(camera, seq))
            await _settle()
        assert metrics.dropped("push", "a", "peer_slow") == 2  # a0 and a1, replaced by a2
        assert metrics.dropped("push", "b", "peer_slow") == 1  # b0, replaced by b1
        ctx = zmq.asyncio.Context()
        pull = ctx.socket(zmq.PULL)
        pull.connect(endpoint)
        got = []
        for _ in range(2):
            header, _payload = await asyncio.wait_for(pull.recv_multipart(), 5)
            got.append(json.loads(header))
        inbox.put_nowait(_frame("b", 2))  # the peer keeps up now: sent at once
        header, payload = await asyncio.wait_for(pull.recv_multipart(), 5)
        got.append(json.loads(header))
        assert payload == bytes(_frame("b", 2).image.data)
        pull.close(0)
        ctx.term()
        await _settle()
        inbox.put_nowait(_frame("a", 3))  # no peer again, and the inbox ends: a3 is dropped
        inbox.producer_done()
        await asyncio.wait_for(task, 5)
        return [(h["camera"], h["seq"]) for h in got]

    received = asyncio.run(main())
    # a has waited since a0 arrived, b since b0: a's newest goes first
    assert received == [("a", 2), ("b", 1), ("b", 2)]
    assert metrics.dropped("push", "a", "peer_slow") == 3
    for camera, sent in (("a", 1), ("b", 2)):
        assert metrics.items_out["push", camera] == sent
        taken = metrics.items_in["push", camera]
        assert taken == sent + metrics.dropped("push", camera)
