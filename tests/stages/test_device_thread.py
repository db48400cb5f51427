"""stages/device_thread.py's DeviceThread: a stepped call whose input (its batch's host glue) is not
ready does not hold up the stepped calls in flight, and calls still start in submission order."""

from __future__ import annotations

import time
from concurrent.futures import Future

from stages.device_thread import DeviceThread


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
