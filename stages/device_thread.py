"""The infer stage's device thread: the only thread that touches the device, running plain
calls one at a time and stepped device computations (npu.device.Steps) interleaved with each
other, so the device runs one computation's dispatches while the host glue of another runs
(docs/inference.md, "Sapiens2: host glue overlapped with the device")."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from npu import thread_priority
from npu.device import INTERLEAVE, Steps, wait_all
from pipeline.messages import now_ns
from stages.batches import Batch
from stages.runtimes import Ran, Runtime

log = logging.getLogger(__name__)

T = TypeVar("T")


class Interleaved:
    """Stepped device computations (Steps) in flight together on one thread, as taconite's
    device is kept busy by queueing the next dispatch before waiting for the current one:
    add() runs a computation's host work up to its first device step; step() resumes a
    computation whose step has finished (the others' launches stay queued on the device
    meanwhile), whose host work up to its next step then runs while the device works
    through the other computations' launches. A computation's end or error goes to its
    `done(result, error)`.

    Which one: of the computations ready to resume, the one whose next device step is the
    longest, by the device time that step took in the last computation of its kind (the
    oldest on a tie or with no history): one host thread serves a box's long host steps
    (a Sapiens2 head's InstanceNorms, in pieces) and another box's staging for its
    attention, and the device idles least if the staging goes first.

    Computations in step with each other do their long host steps at the same time, when
    the device has only the others' short dispatches to run; admits() staggers them: with
    n in flight at most, another computation should join only once those in flight are 1/n
    of the way through (the newest; the others are further), by the device time the last
    computation of their kind took."""

    def __init__(self) -> None:
        self._active: deque[_Entry] = deque()
        self._length: dict[str, float] = {}  # kind -> device seconds of its last computation
        self._profile: dict[str, list[float]] = {}  # kind -> device seconds of each step

    def __len__(self) -> int:
        return len(self._active)

    def admits(self, share: float = 0.5) -> bool:
        """Whether a computation joining now would be out of step with those in flight: each
        is at least `share` of the way through."""
        return all(e.busy >= share * self._length.get(e.kind, 0) for e in self._active)

    def add(
        self, steps: Steps, done: Callable[[Any, BaseException | None], None], kind: str = ""
    ) -> None:
        self._advance(_Entry(steps, done, kind), first=True)

    def step(self) -> None:
        """Resume one computation: of those whose device step has finished (or that are
        doing host work: a step of no launches, a piece of a long host step), the one whose
        next device step is the longest (class docstring), so the device is fed first; if
        none, wait for the oldest outstanding step."""
        ready = [e for e in self._active if all(x.finished() for x in e.launches)]
        entry = max(ready, key=self._next_step_s) if ready else self._active[0]
        self._active.remove(entry)
        try:
            wait_all(entry.launches)
        except BaseException as exc:
            entry.steps.close()
            entry.done(None, exc)
            return
        self._advance(entry, first=False)

    def _next_step_s(self, entry: _Entry) -> float:
        profile = self._profile.get(entry.kind, ())
        return profile[entry.index] if entry.index < len(profile) else 0.0

    def _advance(self, entry: _Entry, first: bool) -> None:
        if entry.launches:
            entry.taken.append(sum(launch.busy_s for launch in entry.launches))
            entry.busy += entry.taken[-1]
        try:
            launches = next(entry.steps) if first else entry.steps.send(None)
        except StopIteration as stop:
            self._length[entry.kind] = entry.busy
            self._profile[entry.kind] = entry.taken
            entry.done(stop.value, None)
        except BaseException as exc:
            entry.done(None, exc)
        else:
            entry.launches = launches
            self._active.append(entry)


@dataclass(eq=False)
class _Entry:
    """A computation in flight: its steps, its outstanding launches, and the device seconds
    of each step it has finished (`taken`; `index` is the next step's)."""

    steps: Steps
    done: Callable[[Any, BaseException | None], None]
    kind: str
    launches: Sequence[Any] = ()
    busy: float = 0.0
    taken: list[float] = field(default_factory=list)

    @property
    def index(self) -> int:
        return len(self.taken) + bool(self.launches)


class DeviceThread:
    """The one thread that touches the device: calls run in submission order.

    A plain call (submit) runs alone, start to end. A stepped call (submit_steps: a
    generator of device steps, npu.device.Steps) may be in flight with up to
    `interleave - 1` other stepped calls (Interleaved, above): while the device runs
    one's dispatches, the host glue of another runs here, so the device does not wait on
    host glue when boxes are queued (staggered: with n in flight at most, another joins once
    the newest is 1/n of the way through, Interleaved.admits). A plain call waits
    for the stepped calls before it.
    A daemon thread, unlike a ThreadPoolExecutor's workers (which the interpreter joins at
    exit), so a device call that never returns cannot keep the process from exiting.
    `running` is (what, time.monotonic() at its start) of the oldest call in progress, or
    None."""

    def __init__(self, name: str, interleave: int = INTERLEAVE) -> None:
        self.name = name
        self.interleave = max(1, interleave)
        self.running: tuple[str, float] | None = None
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, what: str, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue fn(*args) behind the calls already queued; `what` names it in logs."""
        return self._put(what, fn, args, None)

    def submit_steps(
        self,
        what: str,
        kind: str,
        fn: Callable[..., Steps],
        *args: Any,
        ready: Future | None = None,
    ) -> Future:
        """Queue the stepped call fn(*args) (a generator of device steps; its return value is
        the future's result) behind the calls already queued; `kind` (the model) tells
        Interleaved how many steps such a call takes, to stagger the ones in flight. `ready`:
        its input (the batch's host glue); while that is not done the stepped calls in
        flight go on, rather than the thread blocking in fn on it."""
        return self._put(what, fn, args, kind, ready)

    def _put(
        self,
        what: str,
        fn: Callable[..., Any],
        args: tuple,
        kind: str | None,
        ready: Future | None = None,
    ) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"{self.name}: {what} submitted after shutdown")
            self._calls.put((fut, what, fn, args, kind, ready))
        return fut

    def shutdown(self) -> None:
        """Accept no more calls; the thread ends once the queued ones have run."""
        with self._lock:
            self._stopped = True
            self._calls.put(None)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; True if it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def lower_priority(self) -> Future[None]:
        """Queue the lowering of the thread's CPU priority (npu/thread_priority.py): once the
        models are open, when the camera path starts; the open itself has nothing to yield
        to (capture waits for it, pipeline/startup.py), and lowered it took ten times as long
        on a loaded host."""
        return self.submit("lowering its priority", thread_priority.lower_this_thread)

    def _serve(self) -> None:
        active = Interleaved()
        names: deque[tuple[str, float]] = deque()  # the stepped calls in flight, oldest first
        held = None  # the next call, waiting for the stepped calls in flight to end
        waiting = None  # the next stepped call, its input not ready while others step
        stopping = False
        while True:
            while (
                held is None and not stopping and len(active) < self.interleave
                and active.admits(1 / self.interleave)
            ):  # fmt: skip
                if waiting is None:
                    try:
                        call = self._calls.get(block=not active)
                    except queue.Empty:
                        break
                    if call is None:
                        stopping = True
                    elif call[4] is None:
                        held = call
                    else:
                        waiting = call
                    del call  # an idle thread holds no batch
                    continue
                ready = waiting[5]
                if active and ready is not None and not ready.done():
                    break
                call, waiting = waiting, None
                if call[0].set_running_or_notify_cancel():
                    self._start_steps(active, names, *call[:5])
                del call
            if active:
                self.running = names[0]
                active.step()
                self.running = names[0] if names else None
            elif held is not None:
                self._call(*held[:4])
                held = None
            elif stopping and waiting is None:
                return

    def _start_steps(
        self,
        active: Interleaved,
        names: deque,
        fut: Future,
        what: str,
        fn: Callable,
        args: tuple,
        kind: str,
    ) -> None:
        entry = (what, time.monotonic())
        names.append(entry)

        def done(result: Any, error: BaseException | None) -> None:
            names.remove(entry)
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        try:
            steps = fn(*args)
        except BaseException as exc:
            done(None, exc)
            return
        self.running = entry
        active.add(steps, done, kind)

    def _call(self, fut: Future, what: str, fn: Callable[..., Any], args: tuple) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        self.running = (what, time.monotonic())
        try:
            result = fn(*args)
        except BaseException as exc:  # the caller sees it through the future
            fut.set_exception(exc)
        else:
            fut.set_result(result)
        finally:
            self.running = None


def run_prepared(rt: Runtime, glue: Future, device: Any) -> tuple[Ran, int, dict]:
    """On the device thread: wait for a batch's host glue, run it, and stamp when the device
    finished (the scheduler's head-of-line clock starts the next batch there, not when the
    event loop gets round to the completion); with the device's per-model context view
    (npu.device.ModelContexts by model), read on the thread that owns the device."""
    ran = rt.run(glue.result())
    finished = now_ns()
    return ran, finished, device.context_view() if device is not None else {}


def steps_prepared(rt: Runtime, glue: Future, device: Any) -> Steps:
    """run_prepared as steps (Runtime.run_steps), interleaved with another batch's on the
    device thread."""
    ran = yield from rt.run_steps(glue.result())
    finished = now_ns()
    return ran, finished, device.context_view() if device is not None else {}


def batch_name(batch: Batch) -> str:
    """A batch for the logs: its model, seq and jobs by camera and frame."""
    jobs = ", ".join(f"{j.camera} #{j.payload.seq}" for j in batch.jobs)
    return f"{batch.model} batch {batch.seq} ({jobs})"
