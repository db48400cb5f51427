"""ThreadInbox: a BoundedQueue taken from by a worker thread; the same policies, drops and
metrics as on the loop, items from threads and from the loop reaching the worker directly."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import pytest

from pipeline.config import parse_config
from pipeline.graph import Pipeline
from pipeline.messages import now_ns
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue, QueueClosed, ThreadInbox


@dataclass
class Item:
    camera: str
    seq: int
    deadline_ns: int = 1 << 62


def drain(q: ThreadInbox) -> list[tuple[str, int]]:
    out = []
    while (item := q.get_wait(0)) is not None:
        out.append((item.camera, item.seq))
    return out


def test_the_policies_drop_as_on_the_loop():
    async def main():
        m = Metrics()
        oldest = ThreadInbox("o", 3, "drop_oldest", m)
        latest = ThreadInbox("l", 8, "latest", m)
        for i in range(5):
            assert oldest.put_threadsafe(Item("a", i))
            assert await latest.put(Item("a" if i % 2 else "b", i))
        return m, drain(oldest), drain(latest)

    m, oldest, latest = asyncio.run(main())
    assert oldest == [("a", 2), ("a", 3), ("a", 4)]
    assert m.dropped("o", "a", "queue_full") == 2
    assert latest == [("b", 4), ("a", 3)]  # one item per camera, each camera's newest
    assert m.dropped("l") == 3
    assert m.items_in["o", "a"] == 3


@pytest.mark.parametrize("policy", ["drop_oldest", "block"])
def test_items_from_a_thread_reach_the_worker_thread_while_the_loop_is_blocked(policy):
    async def main():
        m = Metrics()
        q = ThreadInbox("s", 4, policy, m)
        q.add_producer()
        got: list[int] = []
        accepted: list[bool] = []

        def worker() -> None:
            while True:
                try:
                    item = q.get_wait(1.0)
                except QueueClosed:
                    return
                if item is not None:
                    got.append(item.seq)

        def producer() -> None:
            for i in range(50):
                accepted.append(q.put_threadsafe(Item("a", i)))
            q.producer_done()

        threads = [threading.Thread(target=f) for f in (worker, producer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)  # on the loop's thread: the loop runs nothing until both are done
        return m, accepted, got

    m, accepted, got = asyncio.run(main())
    assert accepted == [True] * 50
    dropped = m.dropped("s", "a", "queue_full")
    if policy == "block":
        # the producer waited for room each time the worker had not yet taken: every item
        # reached the worker, in order, and nothing was dropped
        assert got == list(range(50)) and dropped == 0
    else:
        # how many the worker took before newer ones pushed them out is the host's speed; in
        # order, the newest four always (nothing came after them), and each one lost counted
        assert got == sorted(got) and got[-4:] == [46, 47, 48, 49]
        assert len(got) + dropped == 50


def test_get_wait_times_out_with_none_then_raises_closed_once_drained():
    async def main():
        q = ThreadInbox("s", 4, "drop_oldest", Metrics())
        t0 = time.perf_counter()
        assert q.get_wait(0.05) is None
        waited = time.perf_counter() - t0
        q.put_nowait(Item("a", 1))
        q.close()
        assert q.get_wait(0).seq == 1
        with pytest.raises(QueueClosed, match="inbox of stage 's' is closed"):
            q.get_wait(0)
        return waited

    # wall-clock-ok: a lower bound (the 0.05 s wait was waited): a loaded host only lengthens it
    assert asyncio.run(main()) >= 0.04


def test_stale_items_are_dropped_at_get_and_counted():
    async def main():
        m = Metrics()
        q = ThreadInbox("s", 4, "drop_oldest", m)
        q.put_threadsafe(Item("a", 0, deadline_ns=now_ns() - 1))
        q.put_threadsafe(Item("a", 1))
        return m, drain(q)

    m, got = asyncio.run(main())
    assert got == [("a", 1)]
    assert m.dropped("s", "a", "stale") == 1


def test_block_producers_wait_for_room_and_give_up_when_told():
    async def main():
        m = Metrics()
        q = ThreadInbox("s", 1, "block", m)
        assert q.put_threadsafe(Item("a", 0))
        results: dict[str, bool] = {}
        stop = threading.Event()
        waiting = threading.Thread(target=lambda: results.update(w=q.put_threadsafe(Item("a", 1))))
        quitting = threading.Thread(
            target=lambda: results.update(q=q.put_threadsafe(Item("a", 2), stop.is_set))
        )
        waiting.start()
        quitting.start()
        await asyncio.sleep(0.2)
        assert results == {}  # both wait for room
        stop.set()
        await asyncio.to_thread(quitting.join, 2)
        assert results == {"q": False}
        assert q.get_wait(0).seq == 0  # room: the waiting producer's item goes in
        await asyncio.to_thread(waiting.join, 2)
        loop_put = asyncio.create_task(q.put(Item("a", 3)))  # a loop producer waits too
        await asyncio.sleep(0.05)
        assert not loop_put.done()
        got = [q.get_wait(1).seq]
        assert await loop_put
        got.append(q.get_wait(1).seq)
        return m, results, got

    m, results, got = asyncio.run(main())
    assert results == {"q": False, "w": True}
    assert got == [1, 3]
    assert m.dropped("s") == 0  # block loses nothing


def test_its_consumer_cannot_be_the_loop():
    async def main():
        q = ThreadInbox("s", 4, "drop_oldest", Metrics())
        with pytest.raises(TypeError, match="consumed by a thread"):
            await q.get()
        with pytest.raises(TypeError, match="consumed by a thread"):
            async for _ in q:
                pass

    asyncio.run(main())


def test_the_pipeline_gives_a_zmq_push_stage_a_thread_inbox(tmp_path):
    config = parse_config(
        {
            "cameras": [{"name": "c", "url": "synthetic:?width=64&height=48&fps=5"}],
            "stages": [
                {"name": "capture", "kind": "capture", "to": ["push", "detect"]},
                {"name": "push", "kind": "zmq_push", "bind": "tcp://127.0.0.1:0"},
                {"name": "detect", "kind": "detect"},
            ],
        },
        tmp_path / "c.toml",
    )

    async def main():
        pipeline = Pipeline(config)
        pipeline._build()  # the stages and their inboxes, as run() makes them
        return {name: type(q) for name, q in pipeline.inboxes.items()}

    assert asyncio.run(main()) == {"push": ThreadInbox, "detect": BoundedQueue}
