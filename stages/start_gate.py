"""One start instant for the paced file cameras of a capture stage: each reader arrives once its
file is open, and all begin their frame schedules when the last has arrived, so frame k of every
file is read (and stamped) at the same time, as a rig of synchronised cameras would capture it.
Without it each file paced itself from its own open, 98-426 ms apart on the Pose2Sim demo."""

from __future__ import annotations

import threading
import time

GATE_TIMEOUT_S = 10.0  # a camera that never opens holds the others back at most this long


class StartGate:
    """A start shared by the readers named in `names`. A reader calls arrive() once, when it
    is about to read its first frame, and leave() instead if it will not (its file did not
    open, or it is not paced)."""

    def __init__(self, names: set[str], timeout_s: float = GATE_TIMEOUT_S) -> None:
        self._waiting = set(names)
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._epoch: float | None = None

    def leave(self, name: str) -> None:
        """`name` will not read: the others no longer wait for it."""
        with self._cond:
            self._waiting.discard(name)
            if not self._waiting:
                self._cond.notify_all()

    def arrive(self, name: str, stop: threading.Event) -> float:
        """Wait until every named reader has arrived or left (at most timeout_s, or until
        stop is set): the monotonic time every reader starts its schedule at."""
        deadline = time.monotonic() + self._timeout_s
        with self._cond:
            self._waiting.discard(name)
            if not self._waiting:
                self._cond.notify_all()
            while self._waiting and self._epoch is None and not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.1))
            if self._epoch is None:
                self._epoch = time.monotonic()
                self._cond.notify_all()
            return self._epoch
