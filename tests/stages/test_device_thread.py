"""stages/device_thread.py's DeviceThread: a stepped call whose input (its batch's host glue) is not
ready does not hold up the stepped calls in flight, and calls still start in submission order."""

from __future__ import annotations

import time
from concurrent.futures import Future

from stages.device_thread import DeviceThread, Interleaved


class Done:
    """A launch that has finished (npu.device.Launch)."""

    expected_s = deadline = busy_s = 0.0

    def wait(self, deadline=None) -> float:
        return 0.0

    def finished(self) -> bool:
        return True


def pieces(log: list, name: str, n: int):
    for i in range(n):
        log.append((name, i))
        time.sleep(0.001)
        yield [Done()] if i % 2 else ()
    return name


def waits_for(ready: Future, log: list):
    value = ready.result()  # as steps_prepared waits for its batch's glue
    log.append(("b", value))
    yield [Done()]
    return value


def test_a_stepped_call_waiting_for_its_input_does_not_stall_the_calls_in_flight():
    thread = DeviceThread("dev", interleave=3)
    log: list = []
    ready: Future = Future()
    try:
        a = thread.submit_steps("a", "m", pieces, log, "a", 200)
        b = thread.submit_steps("b", "m", waits_for, ready, log, ready=ready)
        after = thread.submit("plain", lambda: log.append(("plain",)) or "plain")
        assert a.result(timeout=10) == "a"  # ran to its end while b's input was pending
        assert not b.done() and not after.done() and ("b", 7) not in log
        ready.set_result(7)
        assert b.result(timeout=10) == 7 and after.result(timeout=10) == "plain"
        assert log.index(("b", 7)) < log.index(("plain",))  # submission order kept
    finally:
        thread.shutdown()
        assert thread.join(timeout=10)


class Took(Done):
    """A finished launch that kept the device `busy_s` seconds."""

    def __init__(self, busy_s: float) -> None:
        self.busy_s = busy_s


def steps_of(log: list, name: str, busy: list[float]):
    for i, b in enumerate(busy):
        log.append((name, i))  # the host work before step i
        yield [Took(b)]
    return name


def test_the_computation_whose_next_step_is_longest_is_resumed_first():
    """Of two ready computations, the one about to start the longer device step (by the last
    computation of its kind) gets the host thread, even when the other is older: a box's
    staging for its attention goes before another box's short head pieces."""
    active = Interleaved()
    log: list = []
    results: list = []

    def done(result, error):
        results.append((result, error))

    active.add(steps_of(log, "first", [1.0, 1.0, 5.0]), done, "m")
    while len(active):
        active.step()
    assert results == [("first", None)]
    log.clear()
    active.add(steps_of(log, "a", [1.0, 1.0, 5.0]), done, "m")
    active.add(steps_of(log, "b", [1.0, 1.0, 5.0]), done, "m")
    active.step()  # a tie (both next run a 1.0 s step): the older, a
    active.step()  # a's next step is the 5.0 s one, b's the 1.0 s one: a, though b is older
    assert log == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]
    while len(active):
        active.step()
    assert log[4:] == [("b", 1), ("b", 2)]
    assert [r for r, _ in results] == ["first", "a", "b"]
