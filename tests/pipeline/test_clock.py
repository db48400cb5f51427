"""pipeline.clock: the virtual clock's waits advance it at once and record what was asked;
a set event ends a wait without moving it; the system clock waits for real."""

from __future__ import annotations

import threading
import time

from pipeline.clock import SYSTEM, VirtualClock


def test_a_virtual_wait_returns_at_once_that_much_later():
    clock, stop = VirtualClock(start_s=5.0, epoch_ns=10**18), threading.Event()
    assert (clock.monotonic(), clock.now_ns()) == (5.0, 10**18)
    assert clock.wait(stop, 2.5) is False and clock.wait(stop, 0.5) is False
    assert clock.monotonic() == 8.0 and clock.now_ns() == 10**18 + 3 * 10**9
    assert clock.waits == [2.5, 0.5]
    clock.advance(1.0)
    assert clock.monotonic() == 9.0 and clock.waits == [2.5, 0.5]


def test_a_set_event_ends_a_virtual_wait_without_moving_the_clock():
    clock, stop = VirtualClock(), threading.Event()
    stop.set()
    before = clock.monotonic()
    assert clock.wait(stop, 60.0) is True
    assert clock.monotonic() == before and clock.waits == []


def test_the_system_clock_waits_on_the_event():
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    t0 = SYSTEM.monotonic()
    assert SYSTEM.wait(stop, 30.0) is True  # set by the timer, long before the 30 s
    # wall-clock-ok: a lower bound (the timer's 50 ms): a loaded host only lengthens it
    assert SYSTEM.monotonic() - t0 >= 0.04
    # wall-clock-ok: two reads of the epoch clock, not a duration
    assert abs(SYSTEM.now_ns() - time.time_ns()) < 10**9  # the epoch, not a monotonic count
