"""The detect stage's worker threads (stages/detect_workers.py, Detect.run): each camera on
its own worker, processed in order, cameras on different workers at the same time, a busy
worker's camera waiting as its newest frame (a replaced one counted queue_full), and the
lane's round-robin order."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np

from pipeline.config import parse_config
from pipeline.graph import Context, Outbox
from pipeline.messages import Frame, now_ns
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue
from stages.detect import Detect, DetectOptions
from stages.detect_workers import Lane, default_workers, lane_of

IMAGE = np.zeros((8, 8, 3), np.uint8)


def frame(camera: str, seq: int) -> Frame:
    t = now_ns()
    return Frame(camera, seq, t, t + 60 * 10**9, IMAGE)


def test_the_lane_keeps_the_newest_frame_per_camera_and_goes_round_the_cameras():
    lane = Lane()
    assert lane.put(frame("a", 1)) is None and lane.put(frame("b", 1)) is None
    replaced = lane.put(frame("a", 2))
    assert replaced is not None and replaced.seq == 1  # the caller counts it queue_full
    assert len(lane) == 2
    first = lane.take()
    assert (first.camera, first.seq) == ("a", 2)  # a kept its place in line
    lane.put(frame("a", 3))
    assert lane.take().camera == "b"  # b was never served: before a again
    assert lane.take().camera == "a" and lane.take() is None


def test_a_closed_lane_drains_then_ends():
    async def main():
        lane = Lane()
        lane.put(frame("a", 1))
        lane.close()
        return [await lane.get(), await lane.get()]

    got = asyncio.run(main())
    assert got[0].seq == 1 and got[1] is None


def test_cameras_go_round_the_workers_and_the_default_leaves_a_core_for_the_npu_stage():
    assert lane_of(["a", "b", "c"], 2) == {"a": 0, "b": 1, "c": 0}
    assert default_workers(2) == 1 and default_workers(8) == 7 and default_workers(1) == 1


def make_stage(tmp_path: Path, workers: int) -> Detect:
    config = parse_config(
        {
            "cameras": [{"name": c, "url": "synthetic:"} for c in ("a", "b")],
            "stages": [{"kind": "capture"}],
        },
        tmp_path / "run.toml",
    )
    options = DetectOptions(person="none", face="none", workers=workers)
    return Detect("detect", options, Context(config, Metrics()))


def run_with(stage: Detect, feed, process) -> list[tuple[str, int, str]]:
    """Detect.run with process() replaced, fed by `feed(put)` (a coroutine putting frames):
    what ran, in order, on which thread."""
    ran: list[tuple[str, int, str]] = []

    def recording(f: Frame) -> list:
        process(f)
        ran.append((f.camera, f.seq, threading.current_thread().name))
        return []

    stage.process = recording  # type: ignore[method-assign]

    async def main():
        inbox = BoundedQueue(stage.name, 16, "block", stage.metrics)
        running = asyncio.create_task(stage.run(inbox, Outbox(stage.name, [], stage.metrics)))
        await feed(inbox.put)
        inbox.close()
        await asyncio.wait_for(running, 60)

    asyncio.run(main())
    return ran


def all_of(frames: list[Frame]):
    async def feed(put) -> None:
        for f in frames:
            await put(f)

    return feed


def test_two_workers_run_two_cameras_at_the_same_time_each_in_order(tmp_path):
    # camera a's first frame waits until camera b's has started: one worker would never get
    # there (the 30 s guard fails it), two run them side by side
    b_started = threading.Event()

    def process(f: Frame) -> None:
        if f.camera == "b":
            b_started.set()
        elif f.seq == 0:
            assert b_started.wait(30), "camera b never ran while camera a's frame did"

    frames = [frame(c, s) for s in range(3) for c in ("a", "b")]
    ran = run_with(make_stage(tmp_path, 2), all_of(frames), process)
    threads = {c: {t for cam, _, t in ran if cam == c} for c in ("a", "b")}
    assert len(threads["a"]) == 1 and len(threads["b"]) == 1 and threads["a"] != threads["b"]
    for c in ("a", "b"):
        seqs = [s for cam, s, _ in ran if cam == c]
        assert seqs == sorted(seqs) and seqs[0] == 0 and seqs[-1] == 2  # in order, newest kept


def test_a_busy_workers_camera_keeps_only_its_newest_frame_and_counts_the_rest(tmp_path):
    # a's first frame holds its worker until b's frame (queued last) has run on the other
    started, release = threading.Event(), threading.Event()
    stage = make_stage(tmp_path, 2)

    def process(f: Frame) -> None:
        if (f.camera, f.seq) == ("a", 0):
            started.set()
            assert release.wait(30)
        if f.camera == "b":
            release.set()

    async def feed(put) -> None:
        await put(frame("a", 0))
        assert await asyncio.to_thread(started.wait, 30)
        for f in [frame("a", s) for s in range(1, 5)] + [frame("b", 0)]:
            await put(f)

    ran = run_with(stage, feed, process)
    assert [s for cam, s, _ in ran if cam == "a"] == [0, 4]  # 1-3 replaced: the newest ran
    assert stage.metrics.dropped(stage.name, "a", "queue_full") == 3
