"""stages/start_gate.py: the paced file cameras of a capture stage start their schedules at one
instant, the last arrival's; a camera that will not read leaves, and a stop or the timeout
releases the others."""

from __future__ import annotations

import threading
import time

from stages.start_gate import StartGate


def arrive_in_thread(
    gate: StartGate, name: str, stop: threading.Event, got: dict
) -> threading.Thread:
    def run() -> None:
        got[name] = (gate.arrive(name, stop), time.monotonic())

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_every_camera_starts_at_the_last_arrival():
    gate, stop, got = StartGate({"a", "b", "c"}), threading.Event(), {}
    a = arrive_in_thread(gate, "a", stop, got)
    b = arrive_in_thread(gate, "b", stop, got)
    a.join(0.3)
    assert a.is_alive() and b.is_alive()  # both wait for c
    before_c = time.monotonic()
    epoch = gate.arrive("c", stop)
    a.join(5)
    b.join(5)  # wall-clock-ok: a hang guard
    assert got["a"][0] == got["b"][0] == epoch >= before_c  # wall-clock-ok: an order, no bound
    assert gate.arrive("a", stop) == epoch  # a loop's second call changes nothing


def test_a_camera_that_will_not_read_leaves_and_releases_the_others():
    gate, stop, got = StartGate({"a", "b"}), threading.Event(), {}
    a = arrive_in_thread(gate, "a", stop, got)
    a.join(0.3)
    assert a.is_alive()
    gate.leave("b")  # b's file did not open
    a.join(5)  # wall-clock-ok: a hang guard
    assert not a.is_alive() and "a" in got


def test_a_stop_releases_a_waiting_camera_and_the_timeout_bounds_the_wait():
    gate, stop, got = StartGate({"a", "b"}), threading.Event(), {}
    a = arrive_in_thread(gate, "a", stop, got)
    a.join(0.3)
    stop.set()
    a.join(5)  # wall-clock-ok: a hang guard
    assert not a.is_alive() and "a" in got
    lone = StartGate({"x", "never"}, timeout_s=0.2)
    started = time.monotonic()
    epoch = lone.arrive("x", threading.Event())
    assert epoch >= started + 0.2  # wall-clock-ok: a lower bound, the timeout waited out
