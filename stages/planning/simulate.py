"""The NPU stage's scheduler driven on a simulated device, in discrete time: what `npucam plan`
(stages/planning/npu.py) and the scheduler's tests run instead of the infer stage."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stages.batches import Batch, QueuedJob
from stages.scheduler import BatchScheduler

_NS = 1_000_000_000


class SimClock:
    """A settable ns clock for discrete-event simulation and tests."""

    def __init__(self, start_ns: int = 0) -> None:
        self.t = start_ns

    def __call__(self) -> int:
        return self.t


@dataclass(slots=True)
class SimReport:
    """What a simulated run produced: published results and the device's timeline."""

    results: list[tuple[int, QueuedJob, Any]] = field(
        default_factory=list
    )  # (publish ns, job, out)
    batches: list[tuple[int, int, Batch]] = field(default_factory=list)  # (start, end, batch)


def simulate(
    scheduler: BatchScheduler,
    clock: SimClock,
    events: Iterable[tuple[int, Callable[[], None]]],
    device_s: Callable[[Batch], float],
    until_ns: int,
    run_batch: Callable[[Batch], Sequence[Any]] | None = None,
    on_dispatch: Callable[[Batch], None] | None = None,
    on_complete: Callable[[Batch, list[tuple]], None] | None = None,
) -> SimReport:
    """Drive `scheduler` as the inference stage would, on a simulated device, until until_ns.

    events: (time ns, callback) pairs, e.g. a camera frame that submits jobs; callbacks may
    submit. device_s(batch): the simulated device time of a batch (context loads included).
    run_batch(batch): the outputs per slot (default: the slot payloads). on_dispatch(batch)
    and on_complete(batch, returned results) are the stage's hooks. The device runs one
    batch at a time; up to max_in_flight batches are dispatched ahead (host glue overlap).
    """
    pending = sorted(events, key=lambda e: e[0])
    report = SimReport()
    prepared: list[Batch] = []
    running: tuple[Batch, int] | None = None
    i = 0
    while True:
        while (batch := scheduler.next_batch()) is not None:
            prepared.append(batch)
            if on_dispatch is not None:
                on_dispatch(batch)
        if running is None and prepared:
            batch = prepared.pop(0)
            running = (batch, clock.t + round(device_s(batch) * _NS))
            report.batches.append((clock.t, running[1], batch))
        times = []
        if i < len(pending):
            times.append(pending[i][0])
        if running is not None:
            times.append(running[1])
        wake = scheduler.wake_ns()
        if wake is not None and wake > clock.t:
            times.append(wake)
        if not times or min(times) > until_ns:
            clock.t = until_ns
            return report
        clock.t = max(clock.t, min(times))
        if running is not None and running[1] <= clock.t:
            batch, end_ns = running
            outputs = run_batch(batch) if run_batch else batch.slot_payloads()
            elapsed_s = (end_ns - report.batches[-1][0]) / _NS
            running = None
            returned = scheduler.complete(batch, outputs, elapsed_s, finish_ns=end_ns)
            report.results += [(clock.t, job, output) for job, output in returned]
            if on_complete is not None:
                on_complete(batch, returned)
        while i < len(pending) and pending[i][0] <= clock.t:
            pending[i][1]()
            i += 1
