"""The detect stage's worker threads: each camera is pinned to one worker (its detectors and
landmark models are LiteRT interpreters, which stay on the thread that made them, and its
frames must be processed in order); a frame waits in its worker's lane, the newest per camera,
taken round the cameras as stages' `latest` inboxes are (pipeline/queues.py)."""

from __future__ import annotations

import asyncio
import os

from pipeline.messages import Frame


def default_workers(cpu_count: int | None = None) -> int:
    """The cores left after the NPU stage's host glue (one core), at least one."""
    n = os.cpu_count() if cpu_count is None else cpu_count
    return max(1, (n or 1) - 1)


def lane_of(cameras: list[str], workers: int) -> dict[str, int]:
    """Camera -> worker: round the workers in the cameras' order."""
    return {camera: i % workers for i, camera in enumerate(cameras)}


class Lane:
    """One worker's waiting frames: at most one per camera, the newest (`put` returns the one
    it replaced, a queue_full drop for the caller to count); `get` waits for a frame and takes
    the camera served longest ago first (never served first, ties by arrival). After
    `close`, `get` drains what waits, then returns None."""

    def __init__(self) -> None:
        self._waiting: dict[str, Frame] = {}
        self._served: dict[str, int] = {}
        self._takes = 0
        self._closed = False
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, frame: Frame) -> Frame | None:
        replaced = self._waiting.get(frame.camera)
        self._waiting[frame.camera] = frame  # a replaced camera keeps its place in line
        self._ready.set()
        return replaced

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    def take(self) -> Frame | None:
        """The next waiting frame without waiting, None when none waits."""
        if not self._waiting:
            return None
        camera = min(self._waiting, key=lambda c: self._served.get(c, -1))
        self._served[camera] = self._takes
        self._takes += 1
        return self._waiting.pop(camera)

    async def get(self) -> Frame | None:
        while True:
            frame = self.take()
            if frame is not None:
                return frame
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
