"""The clock a reader thread paces, times out and stamps frames by: the host's (SYSTEM), or a
virtual one (VirtualClock) whose waits advance time at once, so a test of pacing, stalls or
backoff gives the same answer on any host and takes no wall time (docs/architecture.md,
"Testing")."""

from __future__ import annotations

import threading
import time
from typing import Protocol

from pipeline.messages import now_ns


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (time.monotonic's)."""

    def now_ns(self) -> int:
        """Wall-clock ns since the Unix epoch: a frame's capture time."""

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait up to `seconds` for `event`; True when it is set (threading.Event.wait's)."""


class SystemClock:
    """The host's clocks and a real wait."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now_ns(self) -> int:
        return now_ns()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


SYSTEM = SystemClock()


class VirtualClock:
    """Time that moves only when its one waiting thread waits: wait(event, s) returns at once,
    `s` later on this clock (unless the event is set). now_ns is `epoch_ns` plus the virtual
    seconds. For one reader thread at a time: concurrent waiters would each advance it."""

    def __init__(self, start_s: float = 1000.0, epoch_ns: int = 1_700_000_000 * 10**9) -> None:
        self._lock = threading.Lock()
        self._t = start_s
        self._start = start_s
        self._epoch_ns = epoch_ns
        self.waits: list[float] = []  # every wait asked for, in order

    def monotonic(self) -> float:
        with self._lock:
            return self._t

    def now_ns(self) -> int:
        with self._lock:
            return self._epoch_ns + round((self._t - self._start) * 1e9)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        with self._lock:
            self.waits.append(seconds)
            self._t += max(0.0, seconds)
        time.sleep(0)  # let the other threads run, as a real wait would
        return event.is_set()

    def advance(self, seconds: float) -> None:
        """Move the clock forward from outside the waiting thread (a test's own step)."""
        with self._lock:
            self._t += seconds
