"""Small stages and runners the engine tests plug into configs (`engine_stages:Collect`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from pydantic import Field

from pipeline.config import load_config
from pipeline.graph import MapStage, Pipeline, Stage, StageOptions
from pipeline.messages import Frame
from pipeline.startup import Startup


class Collect(Stage):
    """Keeps every item it receives, in order (the pipeline's end, inspected by tests)."""

    kind = "collect"
    accepts = (object,)

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.items: list = []

    async def run(self, inbox, out) -> None:
        async for item in inbox:
            self.items.append(item)


class SlowOptions(StageOptions):
    delay_s: float = Field(0.05, ge=0)


class Slow(MapStage):
    """Passes frames on after sleeping delay_s in its worker thread (a slow model)."""

    kind = "slow"
    accepts = (Frame,)
    Options = SlowOptions

    def process(self, item):
        time.sleep(self.options.delay_s)
        return [item]


class Flaky(MapStage):
    """Raises on every frame whose seq is odd; passes the others on."""

    kind = "flaky"
    accepts = (Frame,)

    def process(self, item):
        if item.seq % 2:
            raise ValueError(f"flaky: refusing seq {item.seq}")
        return [item]


class Dies(Stage):
    """Takes three items, then raises: a stage with a bug in its loop."""

    kind = "dies"
    accepts = (Frame,)

    async def run(self, inbox, out) -> None:
        taken = 0
        async for _ in inbox:
            taken += 1
            if taken == 3:
                raise RuntimeError("dies: the stage's loop broke")


class OpensOptions(StageOptions):
    fails: bool = False  # its open raises


class Opens(Stage):
    """A stage that opens slowly (pipeline/startup.py): it opens when the test sets `may_open`,
    noting the cameras capture had registered by then, then keeps the frames it receives."""

    kind = "opens"
    accepts = (Frame,)
    Options = OpensOptions

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        Startup.of(context).expect(name)
        self.may_open = asyncio.Event()
        self.cameras_at_open: list[str] | None = None
        self.items: list = []

    async def run(self, inbox, out) -> None:
        try:
            await self.may_open.wait()
            self.cameras_at_open = sorted(self.metrics.cameras)
            if self.options.fails:
                raise RuntimeError("opens: the model file is broken")
        finally:
            Startup.of(self.context).opened(self.name)
        async for item in inbox:
            self.items.append(item)


async def until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Return as soon as predicate() holds, however loaded the host; `timeout` only bounds a
    hang (the test then fails naming what it waited for)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, f"timed out after {timeout:g} s waiting for {what}"
        await asyncio.sleep(0.01)


async def start(path, duration: float | None = None):
    """(pipeline, task running it) for the config at path, without signal handlers."""
    pipeline = Pipeline(load_config(path))
    task = asyncio.create_task(pipeline.run(duration=duration, handle_signals=False))
    while not pipeline.stages and not task.done():
        await asyncio.sleep(0.01)
    return pipeline, task


async def subscriber(pipeline: Pipeline, stage: str = "publish", topic: str = ""):
    """A zmq.asyncio SUB connected to the publish stage once it has bound."""
    pub = pipeline.stages[stage]
    await asyncio.wait_for(pub.bound.wait(), 5)
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(pub.endpoint)
    return sub


async def receive(sub, until_idle_s: float = 1.0, limit: int = 100_000) -> list[list[bytes]]:
    """Messages until none arrives for until_idle_s (or limit)."""
    got = []
    while len(got) < limit and await sub.poll(int(until_idle_s * 1000)):
        got.append(await sub.recv_multipart())
    return got


async def receive_until_done(sub, task: asyncio.Task, drain_s: float = 1.0) -> list[list[bytes]]:
    """Messages until the pipeline's task has ended, then those still arriving (until none
    comes for drain_s): a run that ends by itself, however slowly this host runs it."""
    got = []
    while not task.done():
        if await sub.poll(100):
            got.append(await sub.recv_multipart())
    while await sub.poll(int(drain_s * 1000)):
        got.append(await sub.recv_multipart())
    return got


def run_and_receive(
    path,
    duration: float | None = None,
    topic: str = "",
    until_idle_s: float = 1.0,
    stop_within_s: float | None = None,
) -> tuple[Pipeline, int, list[list[bytes]]]:
    """Run the config at path with a subscriber on its publish stage from when it binds:
    (pipeline, exit code, the messages received until none came for until_idle_s).
    stop_within_s: the run must then end by itself within that long (else TimeoutError)."""

    async def main():
        pipeline, task = await start(path, duration=duration)
        sub = await subscriber(pipeline, topic=topic)
        messages = await receive(sub, until_idle_s=until_idle_s)
        code = await (task if stop_within_s is None else asyncio.wait_for(task, stop_within_s))
        return pipeline, code, messages

    return asyncio.run(main())


class Hangs(MapStage):
    """Blocks forever in its worker thread on the first frame: a wedged device call."""

    kind = "hangs"
    accepts = (Frame,)

    def process(self, item):
        threading.Event().wait()
        return [item]
