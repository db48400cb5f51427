"""Bounded queues between stages, each with a declared policy for when it is full.

- `drop_oldest`: the oldest waiting item of the camera with the most items waiting is
  dropped (reason queue_full) so the newest gets in; live cameras: latency stays bounded,
  the latest frame wins, and a fast camera cannot crowd a slow one out of a shared queue.
- `block`: the producer waits for room; files and offline runs: nothing is lost.
- `latest`: one waiting item per camera, the newest: a newer item replaces the waiting one
  (queue_full) in its place in line; a stage that only ever wants the current frame of each
  camera. The line is ordered by when each camera was last served (never served first, ties
  by arrival), so the consumer goes round the cameras. It holds one item per camera whatever
  `size` says: a slot per camera is what round-robin needs (with fewer, the camera whose
  frame arrives first after the consumer catches up is served out of turn every time).

The consumer side drops items past their deadline (reason stale) instead of handing them
on, counts items in per (stage, camera) and records the time each item waited.
Producers may be asyncio tasks (`await put`) or threads (`put_threadsafe`, e.g. capture
reader threads); `close()` ends the queue: getters drain what is left, putters give up.
A ThreadInbox is the same queue for a stage whose consumer is a worker thread of its own
(Stage.inbox_thread): items reach that thread without a wake-up of the event loop each.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from pipeline.errors import NpucamError
from pipeline.messages import now_ns
from pipeline.metrics import Metrics

T = TypeVar("T")


class Policy(StrEnum):
    DROP_OLDEST = "drop_oldest"
    BLOCK = "block"
    LATEST = "latest"


class QueueClosed(NpucamError):
    """get() on a queue that is closed and empty: the producers are done."""


def camera_of(item: Any) -> str:
    return getattr(item, "camera", "")


def oldest_of_busiest_camera(
    items: Sequence[T], camera: Callable[[T], str], arrival: Callable[[T], float]
) -> int:
    """The `drop_oldest` policy's victim (every queue that holds several cameras uses it): the
    index of the oldest item (smallest arrival) among the cameras with the most items
    waiting, so a fast camera cannot push a slow one's work out of a shared queue."""
    counts = Counter(camera(it) for it in items)
    busiest = max(counts.values())
    return min(
        (i for i, it in enumerate(items) if counts[camera(it)] == busiest),
        key=lambda i: arrival(items[i]),
    )


class BoundedQueue:
    """The inbox of one stage. Items are anything with `camera` (and `deadline_ns` to expire).

    Must be created inside the running event loop that its consumer runs on.
    """

    def __init__(
        self,
        stage: str,
        size: int,
        policy: Policy | str,
        metrics: Metrics,
        drop_stale: bool = True,
    ) -> None:
        if size < 1:
            raise ValueError(f"queue of stage {stage!r}: size must be >= 1, got {size}")
        self.stage = stage
        self.size = size
        self.policy = Policy(policy)
        self._latest, self._block = self.policy is Policy.LATEST, self.policy is Policy.BLOCK
        self.metrics = metrics
        self.drop_stale = drop_stale
        self._loop = asyncio.get_running_loop()
        self._items: deque[tuple[Any, float]] = deque()
        self._getters: deque[asyncio.Future] = deque()
        self._putters: deque[asyncio.Future] = deque()
        self._closed = False
        self._producers = 0
        self._served: dict[str, int] = {}  # latest: camera -> the get() count when last served
        self._gets = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def add_producer(self) -> None:
        """Register one producer; the queue closes when every producer has called done()."""
        self._producers += 1

    def producer_done(self) -> None:
        self._producers -= 1
        if self._producers <= 0:
            self.close()

    def close(self) -> None:
        """No more items will be accepted; waiting getters drain, waiting putters give up."""
        self._closed = True
        for fut in (*self._getters, *self._putters):
            if not fut.done():
                fut.set_result(None)
        self._getters.clear()
        self._putters.clear()

    def discard(self) -> int:
        """Close and throw away what is waiting (the consumer is gone); returns the count."""
        n = len(self._items)
        self._items.clear()
        self.close()
        return n

    async def put(self, item: Any) -> bool:
        """Add an item by the queue's policy; False if the queue is closed (item not taken)."""
        if self._block:
            while not self._closed and len(self._items) >= self.size:
                fut = self._loop.create_future()
                self._putters.append(fut)
                try:
                    await fut
                except asyncio.CancelledError:
                    self._forget_waiter(fut, self._putters, room=len(self._items) < self.size)
                    raise
        return self.put_nowait(item)

    def put_nowait(self, item: Any) -> bool:
        """Add an item without waiting: a full `drop_oldest` queue drops to make room, `latest`
        replaces the camera's waiting item; a full `block` queue refuses (False, counted
        queue_full)."""
        if self._closed:
            return False
        if self._latest:
            return self._put_latest(item)
        if len(self._items) >= self.size:
            if self._block:
                self.metrics.drop(self.stage, camera_of(item), "queue_full")
                return False
            self._drop_oldest_of_busiest_camera()
        self._items.append((item, time.perf_counter()))
        if self._getters:
            _wake_one(self._getters)
        return True

    def _put_latest(self, item: Any) -> bool:
        # Replacing in place keeps the camera's turn: moving it to the back starved cameras
        # whose frames arrive just before each get.
        cam = camera_of(item)
        for i, (old, _) in enumerate(self._items):
            if camera_of(old) == cam:
                self._items[i] = (item, time.perf_counter())
                self.metrics.drop(self.stage, cam, "queue_full")
                return True
        turn = self._served.get(cam, -1)
        at = len(self._items)
        while at and self._served.get(camera_of(self._items[at - 1][0]), -1) > turn:
            at -= 1
        self._items.insert(at, (item, time.perf_counter()))
        _wake_one(self._getters)
        return True

    def _drop_oldest_of_busiest_camera(self) -> None:
        i = oldest_of_busiest_camera(self._items, lambda e: camera_of(e[0]), lambda e: e[1])
        item, _ = self._items[i]
        del self._items[i]
        self.metrics.drop(self.stage, camera_of(item), "queue_full")

    def _forget_waiter(
        self, fut: asyncio.Future, waiters: deque[asyncio.Future], room: bool
    ) -> None:
        # A cancelled waiter may already have been woken (its future resolved, then the
        # task cancelled before it ran): that wakeup stood for a free slot or a waiting
        # item, so it passes to the next waiter or that one would sleep on it forever.
        with contextlib.suppress(ValueError):
            waiters.remove(fut)
        if fut.done() and not fut.cancelled() and room and not self._closed:
            _wake_one(waiters)

    def put_threadsafe(self, item: Any, give_up: Callable[[], bool] = lambda: False) -> bool:
        """put() from a thread that is not the loop's. For `block` it waits for room, checking
        give_up() (and the queue closing) every 100 ms so a stopping producer never hangs, and
        returns True iff the item was queued. The other policies hand the item to the loop
        without waiting: True unless the queue or loop was already closed (should the queue
        close before the loop runs the hand-over, the item is refused there)."""
        if self._closed:
            return False
        try:
            if self.policy is not Policy.BLOCK:
                self._loop.call_soon_threadsafe(self.put_nowait, item)
                return True
            return self._put_block_threadsafe(item, give_up)
        except RuntimeError:  # the loop is closed: the pipeline is gone
            return False

    def _put_block_threadsafe(self, item: Any, give_up: Callable[[], bool]) -> bool:
        # The put runs as a task on the loop; giving up cancels that task on the loop, so the
        # put either completed (the item is queued) or was cancelled (it is not), and the
        # answer is read from the finished task, never guessed.
        tasks: list[asyncio.Task[bool]] = []
        finished = threading.Event()

        def start() -> None:
            task = self._loop.create_task(self.put(item))
            task.add_done_callback(lambda _: finished.set())
            tasks.append(task)

        def taken() -> bool:
            return (
                bool(tasks) and tasks[0].done() and not tasks[0].cancelled() and tasks[0].result()
            )

        self._loop.call_soon_threadsafe(start)
        cancelling = False
        while not finished.wait(0.1):
            if self._loop.is_closed() or (cancelling and not self._loop.is_running()):
                return taken()  # the pipeline is gone: no loop will finish the put now
            if not cancelling and (self._closed or give_up()):
                try:
                    # Runs after start(): the loop runs thread-safe callbacks in order.
                    self._loop.call_soon_threadsafe(lambda: tasks[0].cancel())
                except RuntimeError:  # the loop closed meanwhile
                    return taken()
                cancelling = True
        return taken()

    async def get(self) -> Any:
        """The next item that is not past its deadline; QueueClosed once closed and empty."""
        while (item := self._take()) is _NOTHING:
            if self._closed:
                raise QueueClosed(f"inbox of stage {self.stage!r} is closed")
            fut = self._loop.create_future()
            self._getters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                self._forget_waiter(fut, self._getters, room=bool(self._items))
                raise
        return item

    def get_nowait(self) -> Any | None:
        """The next waiting item that is not past its deadline, or None when none waits."""
        item = self._take()
        return None if item is _NOTHING else item

    def _take(self) -> Any:
        """The next waiting item that is not past its deadline, or _NOTHING (none waits)."""
        while self._items:
            item, put_at = self._items.popleft()
            if self._putters:
                _wake_one(self._putters)
            cam = camera_of(item)
            if self._latest:
                self._served[cam] = self._gets
                self._gets += 1
            self.metrics.took(self.stage, cam, time.perf_counter() - put_at)
            if self.drop_stale and now_ns() > getattr(item, "deadline_ns", 1 << 63):
                self.metrics.drop(self.stage, cam, "stale")
                continue
            return item
        return _NOTHING

    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        # A waiting item is taken here: no get() coroutine per item (the consumer's hot path).
        item = self._take()
        if item is _NOTHING:
            try:
                item = await self.get()
            except QueueClosed:
                raise StopAsyncIteration from None
        return item


_NOTHING = object()  # _take(): no item is waiting


def _wake_one(waiters: deque[asyncio.Future]) -> None:
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return


class ThreadInbox(BoundedQueue):
    """A BoundedQueue consumed by one worker thread (`get_wait`, `get_nowait`), not by the
    event loop. Its state is guarded by a lock, so producers on the loop (`put_nowait`,
    `await put`) and on other threads (`put_threadsafe`) add items directly and wake the
    consumer through a condition: a frame from a capture thread reaches a sending thread
    without passing the loop (stages.frame_push; docs/benchmarks.md, frame_transport). Same
    policies, drops and metrics."""

    BLOCK_POLL_S = 0.1  # how often a `block` producer waiting for room checks give_up()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cond = threading.Condition()

    def put_nowait(self, item: Any) -> bool:
        with self._cond:
            ok = super().put_nowait(item)
            self._cond.notify_all()
        return ok

    async def put(self, item: Any) -> bool:
        """put_nowait, except that a full `block` queue is waited for on a worker thread (a
        cancelled wait gives up at its next check; the item may have been queued by then)."""
        if not self._block:
            return self.put_nowait(item)
        gave_up = threading.Event()
        try:
            return await asyncio.to_thread(self._put_when_room, item, gave_up.is_set)
        finally:
            gave_up.set()

    def put_threadsafe(self, item: Any, give_up: Callable[[], bool] = lambda: False) -> bool:
        """put from any thread, without the loop; `block` waits for room, checking give_up()
        and the queue closing every BLOCK_POLL_S (True iff the item was queued)."""
        if not self._block:
            return self.put_nowait(item)
        return self._put_when_room(item, give_up)

    def _put_when_room(self, item: Any, give_up: Callable[[], bool]) -> bool:
        with self._cond:
            while not self._closed and len(self._items) >= self.size:
                if give_up():
                    return False
                self._cond.wait(self.BLOCK_POLL_S)
            return self.put_nowait(item)

    def get_wait(self, timeout: float) -> Any | None:
        """The consumer thread's next item (not past its deadline), waiting up to timeout
        seconds (None then); QueueClosed once closed and empty."""
        with self._cond:
            while (item := self._take()) is _NOTHING:
                if self._closed:
                    raise QueueClosed(f"inbox of stage {self.stage!r} is closed")
                if not self._cond.wait(timeout):
                    return None
            self._cond.notify_all()  # room for a waiting `block` producer
            return item

    def get_nowait(self) -> Any | None:
        with self._cond:
            item = super().get_nowait()
            self._cond.notify_all()
            return item

    async def get(self) -> Any:
        raise TypeError(f"inbox of stage {self.stage!r} is consumed by a thread: use get_wait")

    def __anext__(self) -> Any:
        raise TypeError(f"inbox of stage {self.stage!r} is consumed by a thread: use get_wait")

    def close(self) -> None:
        with self._cond:
            super().close()
            self._cond.notify_all()

    def discard(self) -> int:
        with self._cond:
            return super().discard()
