"""Bounded queues: each policy's behaviour when full, stale drops, closing, thread producers."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import pytest

from pipeline.messages import now_ns
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue, QueueClosed


@dataclass
class Item:
    camera: str
    seq: int
    deadline_ns: int = 1 << 62


def test_drop_oldest_keeps_the_newest_and_counts_queue_full_per_camera():
    async def main():
        m = Metrics()
        q = BoundedQueue("s", 3, "drop_oldest", m)
        for i in range(5):
            assert await q.put(Item("a", i))
        got = [(await q.get()).seq for _ in range(3)]
        return m, got

    m, got = asyncio.run(main())
    assert got == [2, 3, 4]
    assert m.dropped("s", "a", "queue_full") == 2


def test_drop_oldest_takes_from_the_busiest_camera_so_a_slow_one_keeps_its_frames():
    async def main():
        m = Metrics()
        q = BoundedQueue("s", 4, "drop_oldest", m)
        await q.put(Item("fast", 0))
        await q.put(Item("slow", 100))
        for i in range(1, 10):
            await q.put(Item("fast", i))
        q.close()
        return m, [(item.camera, item.seq) async for item in q]

    m, got = asyncio.run(main())
    assert got == [("slow", 100), ("fast", 7), ("fast", 8), ("fast", 9)]
    assert m.dropped("s", "fast", "queue_full") == 7
    assert m.dropped("s", "slow") == 0


def test_latest_keeps_one_item_per_camera():
    async def main():
        m = Metrics()
        q = BoundedQueue("s", 8, "latest", m)
        for i in range(4):
            await q.put(Item("a", i))
            await q.put(Item("b", 10 + i))
        q.close()
        return m, [(item.camera, item.seq) async for item in q]

    m, got = asyncio.run(main())
    assert sorted(got) == [("a", 3), ("b", 13)]
    assert m.dropped("s", "a", "queue_full") == 3
    assert m.dropped("s", "b", "queue_full") == 3


def test_latest_replacement_keeps_the_cameras_place_in_line():
    async def main():
        q = BoundedQueue("s", 8, "latest", Metrics())
        for cam, seq in (("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1)):
            await q.put(Item(cam, seq))
        q.close()
        return [(item.camera, item.seq) async for item in q]

    assert asyncio.run(main()) == [("a", 1), ("b", 1), ("c", 0)]


def test_latest_serves_the_camera_served_longest_ago_first_and_holds_one_item_per_camera():
    async def main():
        m = Metrics()
        q = BoundedQueue("s", 2, "latest", m)
        order = []
        for seq in range(3):
            for cam in ("a", "b", "c", "d"):  # a always sends first: it must not always win
                await q.put(Item(cam, seq))
            order.append((await q.get()).camera)
        for cam in "dcba":
            await q.put(Item(cam, 9))
        while len(q):
            order.append((await q.get()).camera)
        return m, order

    m, order = asyncio.run(main())
    # size 2 does not cap a latest queue: each of the 4 cameras keeps a slot and a turn
    assert order == ["a", "b", "c", "d", "a", "b", "c"]
    assert m.dropped("s", "a", "queue_full") == 2  # replaced at seq 2 and 9


def test_block_waits_for_room_and_loses_nothing():
    async def main():
        m = Metrics()
        q = BoundedQueue("s", 2, "block", m)
        received = []

        async def consume():
            async for item in q:
                received.append(item.seq)
                await asyncio.sleep(0.001)

        consumer = asyncio.create_task(consume())
        for i in range(50):
            assert await q.put(Item("a", i))
            assert len(q) <= 2
        q.close()
        await consumer
        return m, received

    m, received = asyncio.run(main())
    assert received == list(range(50))
    assert m.dropped() == 0


def test_stale_items_are_dropped_at_get_and_counted():
    async def main():
        m = Metrics()
        q = BoundedQueue("s", 4, "block", m)
        await q.put(Item("a", 0, deadline_ns=now_ns() - 1))
        await q.put(Item("a", 1))
        got = await q.get()
        keep = BoundedQueue("k", 4, "block", Metrics(), drop_stale=False)
        await keep.put(Item("a", 0, deadline_ns=now_ns() - 1))
        return m, got, await keep.get()

    m, got, kept = asyncio.run(main())
    assert got.seq == 1
    assert kept.seq == 0  # drop_stale=False hands late items on
    assert m.dropped("s", "a", "stale") == 1
    assert m.items_in["s", "a"] == 2  # both were taken in; one was dropped as stale


def test_get_nowait_takes_what_waits_skipping_stale_items_and_never_waits():
    async def main():
        m = Metrics()
        q = BoundedQueue("s", 4, "drop_oldest", m)
        empty = q.get_nowait()
        q.put_nowait(Item("a", 0, deadline_ns=now_ns() - 1))
        q.put_nowait(Item("a", 1))
        return m, empty, q.get_nowait(), q.get_nowait()

    m, empty, first, after = asyncio.run(main())
    assert empty is None and first.seq == 1 and after is None
    assert m.dropped("s", "a", "stale") == 1


def test_close_lets_getters_drain_then_raises_closed():
    async def main():
        q = BoundedQueue("s", 4, "drop_oldest", Metrics())
        await q.put(Item("a", 0))
        q.close()
        assert not await q.put(Item("a", 1))
        first = await q.get()
        with pytest.raises(QueueClosed):
            await q.get()
        return first

    assert asyncio.run(main()).seq == 0


def test_threadsafe_put_blocks_on_a_full_block_queue_until_room():
    async def main():
        q = BoundedQueue("s", 1, "block", Metrics())
        done = []

        def producer():
            for i in range(3):
                done.append(q.put_threadsafe(Item("a", i)))

        t = threading.Thread(target=producer)
        t.start()
        await asyncio.sleep(0.3)
        assert len(done) == 1  # the second put waits for room
        seqs = [(await q.get()).seq for _ in range(3)]
        await asyncio.to_thread(t.join, 2)
        return done, seqs

    done, seqs = asyncio.run(main())
    assert done == [True, True, True]
    assert seqs == [0, 1, 2]


def test_threadsafe_put_gives_up_promptly_when_the_producer_stops():
    async def main():
        q = BoundedQueue("s", 1, "block", Metrics())
        stop = threading.Event()
        result = {}

        def producer():
            q.put_threadsafe(Item("a", 0))
            t0 = time.monotonic()
            result["taken"] = q.put_threadsafe(Item("a", 1), give_up=stop.is_set)
            result["waited"] = time.monotonic() - t0

        t = threading.Thread(target=producer)
        t.start()
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.to_thread(t.join, 2)
        return result, t.is_alive()

    result, alive = asyncio.run(main())
    assert not alive
    assert result["taken"] is False
    # wall-clock-ok: a hang guard: without give_up the put waits for a consumer that never comes
    assert result["waited"] < 2.0


def test_a_woken_putter_that_is_cancelled_passes_the_wakeup_to_the_next_putter():
    async def main():
        q = BoundedQueue("s", 1, "block", Metrics())
        await q.put(Item("a", 0))
        first = asyncio.create_task(q.put(Item("a", 1)))
        second = asyncio.create_task(q.put(Item("a", 2)))
        await asyncio.sleep(0)  # both wait for room
        assert (await q.get()).seq == 0  # wakes the first putter...
        first.cancel()  # ...which is cancelled before it runs
        taken = await asyncio.wait_for(second, 2)
        assert first.cancelled()
        return taken, [item.seq for item, _ in q._items]

    taken, waiting = asyncio.run(main())
    assert taken is True
    assert waiting == [2]


def test_a_woken_getter_that_is_cancelled_passes_the_wakeup_to_the_next_getter():
    async def main():
        q = BoundedQueue("s", 1, "block", Metrics())
        first = asyncio.create_task(q.get())
        second = asyncio.create_task(q.get())
        await asyncio.sleep(0)  # both wait for an item
        assert await q.put(Item("a", 7))  # wakes the first getter...
        first.cancel()  # ...which is cancelled before it runs
        got = await asyncio.wait_for(second, 2)
        assert first.cancelled()
        return got

    assert asyncio.run(main()).seq == 7


def test_threadsafe_put_says_true_when_the_item_got_in_just_as_the_producer_gave_up():
    async def main():
        loop = asyncio.get_running_loop()
        q = BoundedQueue("s", 1, "block", Metrics())
        await q.put(Item("a", 0))

        def give_up() -> bool:
            # Make room and let the waiting put finish, then give up: too late to stop it.
            assert asyncio.run_coroutine_threadsafe(q.get(), loop).result(2).seq == 0
            deadline = time.monotonic() + 2
            while not len(q) and time.monotonic() < deadline:
                time.sleep(0.005)
            return True

        taken = await asyncio.to_thread(q.put_threadsafe, Item("a", 1), give_up)
        return taken, [item.seq for item, _ in q._items]

    taken, waiting = asyncio.run(main())
    assert waiting == [1]  # the item was queued...
    assert taken is True  # ...and the producer is told so


def test_threadsafe_put_that_gives_up_leaves_nothing_queued_behind():
    async def main():
        q = BoundedQueue("s", 1, "block", Metrics())
        await q.put(Item("a", 0))
        taken = await asyncio.to_thread(q.put_threadsafe, Item("a", 1), lambda: True)
        assert (await q.get()).seq == 0  # room now: a put left pending would slip in here
        await asyncio.sleep(0.05)
        return taken, len(q)

    assert asyncio.run(main()) == (False, 0)
