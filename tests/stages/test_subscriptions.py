"""stages/subscriptions.py on a real XPUB: subscriptions are counted per connection, a
connection over its count, over the total or with a subscription longer than max_bytes is
disconnected (and its subscriptions leave the count), unsubscriptions count down."""

from __future__ import annotations

import time

import pytest
import zmq

from stages.subscriptions import SubscriptionGuard, SubscriptionLimits


@pytest.fixture
def xpub():
    ctx = zmq.Context()
    socks = []

    def make(limits: SubscriptionLimits):
        pub = ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.LINGER, 0)
        guard = SubscriptionGuard(limits, "test")
        guard.configure(pub)
        pub.bind("tcp://127.0.0.1:*")
        endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        at = f"inproc://monitor-{id(pub)}"
        pub.monitor(at, zmq.EVENT_DISCONNECTED)
        mon = ctx.socket(zmq.PAIR)
        mon.connect(at)
        guard.attach(pub, mon, endpoint)
        socks.extend([pub, mon])
        return pub, guard, endpoint

    def sub(endpoint: str, topics: list[bytes]):
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 10_000)  # stays away once cut, for the counts
        s.connect(endpoint)
        for t in topics:
            s.setsockopt(zmq.SUBSCRIBE, t)
        socks.append(s)
        return s

    yield make, sub
    for s in socks:
        s.close(0)
    ctx.term()


def settle(guard: SubscriptionGuard, until, seconds: float = 3.0) -> None:
    end = time.monotonic() + seconds
    while not until() and time.monotonic() < end:
        guard.drain()
        time.sleep(0.02)
    guard.drain()


def test_counts_per_connection_and_unsubscriptions_count_down(xpub):
    make, sub = xpub
    _, guard, endpoint = make(SubscriptionLimits(64, 8, 100))
    a = sub(endpoint, [b"det/a", b"pose/a", b"stats"])
    sub(endpoint, [b"det/b"])
    settle(guard, lambda: guard.total == 4)
    assert sorted(guard.held.values()) == [1, 3] and guard.disconnected == 0
    a.setsockopt(zmq.UNSUBSCRIBE, b"pose/a")
    settle(guard, lambda: guard.total == 3)
    assert guard.total == 3


def test_a_connection_over_its_count_is_disconnected_and_its_subscriptions_leave(xpub):
    make, sub = xpub
    _, guard, endpoint = make(SubscriptionLimits(64, 8, 100))
    sub(endpoint, [b"det/a"])
    sub(endpoint, [b"t%02d" % i for i in range(20)])
    settle(guard, lambda: guard.disconnected == 1 and guard.total == 1)
    assert (guard.disconnected, guard.total, dict(guard.held)) == (1, 1, {min(guard.held): 1})


def test_the_total_is_bounded_across_connections(xpub):
    make, sub = xpub
    _, guard, endpoint = make(SubscriptionLimits(64, 8, 10))
    for k in range(4):
        sub(endpoint, [b"%d-%d" % (k, i) for i in range(4)])
        settle(guard, lambda k=k: guard.total + 4 * guard.disconnected >= 4 * (k + 1))
    assert guard.disconnected >= 1 and guard.total <= 10


def test_a_subscription_longer_than_max_bytes_disconnects(xpub):
    make, sub = xpub
    _, guard, endpoint = make(SubscriptionLimits(16, 8, 100))
    sub(endpoint, [b"x" * 17])
    settle(guard, lambda: guard.disconnected == 1)
    assert guard.disconnected == 1 and guard.total == 0
