"""Stepped device computations: host work between the launches of one device step, driven alone
here (run_steps, busy_steps) or several interleaved on the infer stage's device thread
(stages/device_thread.py), as taconite keeps its device busy."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from typing import Any, Protocol

from npu.device.errors import DeviceError


class Launch(Protocol):
    """A started run. wait() waits for it without holding the GIL, checks the final state
    and returns wall seconds; past `deadline` (time.perf_counter() seconds; default the
    launch's own) it raises DeviceTimeout. expected_s: the time the device should take;
    busy_s, once waited for: the device time it took (from when the device could start it,
    after the dispatches before it, to when its wait saw it done)."""

    expected_s: float
    deadline: float
    busy_s: float

    def wait(self, deadline: float | None = None) -> float: ...

    def finished(self) -> bool:
        """Whether it has finished (one read of its state; wait() then returns at once)."""
        ...


Steps = Generator[Sequence[Launch], None, Any]


def wait_all(launches: Iterable[Launch]) -> None:
    """Wait for launches in order; on an error the others are waited for too, then the first
    error is raised (as run_all)."""
    first: BaseException | None = None
    for launch in launches:
        try:
            launch.wait()
        except DeviceError as exc:
            first = first or exc
    if first is not None:
        raise first


def run_steps(steps: Steps) -> Any:
    """Drive a stepped device computation alone: a generator that does its host work, starts
    the launches of one device step and yields them; each is resumed once they are done, and
    its return value is the result. The calls reach the device in the generator's order."""
    try:
        launches = next(steps)
        while True:
            try:
                wait_all(launches)
            except BaseException:
                steps.close()
                raise
            launches = steps.send(None)
    except StopIteration as stop:
        return stop.value


def busy_steps(steps: Steps) -> Generator[Sequence[Launch], None, tuple[Any, float]]:
    """The same steps, returning (their result, the device seconds their launches took: the
    sum of busy_s, which leaves out the device's idle time between them and the time it
    spent on other computations' launches interleaved with them)."""
    busy = 0.0
    try:
        launches = next(steps)
        while True:
            yield launches
            busy += sum(launch.busy_s for launch in launches)
            launches = steps.send(None)
    except StopIteration as stop:
        return stop.value, busy


# stepped computations a device thread keeps in flight (the infer stage's, stages/
# device_thread.py), and so the buffer slots a stepped model allocates (npu.models.sapiens2.npu.
# Sapiens2Replay): with two, the device has only the other computation's one queued step to
# run while the host works on a long step (a Sapiens2 head's InstanceNorms), and idles once
# that is done; with three it has the steps of two (docs/inference.md, "Sapiens2: host glue
# overlapped with the device")
INTERLEAVE = 3
