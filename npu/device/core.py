"""The bookkeeping both devices share (DeviceCore) and the wait every dispatch goes through: paced
state() polls that never block holding the GIL, deadlines, and recovery from a hung dispatch.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from npu.device.buffers import Buffer, check_sub_range
from npu.device.contexts import (
    CONTEXT_WAIT_S,
    ContextCache,
    DeviceStats,
    ModelContexts,
    ctx_cache_cap,
)
from npu.device.errors import DeviceError, DeviceFailed, DeviceInterrupted, DeviceTimeout
from npu.device.kernels import KernelSpec, KernelTiming, check_insts_words
from npu.device.protocol import ERT_CMD_STATE_COMPLETED, IN_FLIGHT_STATES
from npu.device.steps import Launch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WaitPolicy:
    """How a dispatch is waited for (docs/inference.md, "Device waits").

    The wait sleeps (time.sleep releases the GIL) until `pace` of the dispatch's expected
    time has passed, when that time is known and at least `min_pace_s`; then it reads the
    run's state every `poll_s` until twice the expected time, every `slow_poll_s` after.
    The deadline is `begin + max(deadline_factor * expected, expected + deadline_margin_s)`;
    past it the dispatch is hung. More than `max_parked` parked contexts fail the device.
    """

    pace: float = 0.9
    min_pace_s: float = 3e-4
    poll_s: float = 5e-5
    slow_poll_s: float = 1e-3
    deadline_factor: float = 8.0
    deadline_margin_s: float = 0.2
    max_parked: int = 2

    def deadline_after(self, expected_s: float) -> float:
        """Seconds from a dispatch's start to its deadline."""
        return max(self.deadline_factor * expected_s, expected_s + self.deadline_margin_s)


def timing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """`TACONITE_TIMING` turns instrumentation on by its presence, even when empty."""
    env = os.environ if environ is None else environ
    return "TACONITE_TIMING" in env


class LoadedKernel(Protocol):
    """What DeviceCore keeps of a kernel: its spec, patches, counters, launches in flight."""

    spec: KernelSpec
    patches: dict[int, int]
    timing: KernelTiming
    pending: list[DeviceLaunch]  # launches not yet waited for, in submission order
    freed: bool


class DeviceLaunch:
    """A started dispatch (each device subclasses it with its run handle).

    t0: the start() call; t_start: submission; begin: when the device should start it (after
    the dispatches queued before it); expected_s: its expected device time; wake_at: when its
    wait first reads the state; deadline: past it the dispatch is hung. Once finished, wall
    (seconds since t0) or error is set."""

    def __init__(
        self, device: DeviceCore, kernel: Any, buffers: Sequence[Buffer], t0: float
    ) -> None:
        self.device, self.kernel, self.buffers = device, kernel, tuple(buffers)
        self.key = tuple(b.id for b in self.buffers)
        self.t0 = t0
        self.t_start = self.begin = self.wake_at = self.fast_until = time.perf_counter()
        self.expected_s = 0.0
        self.deadline = float("inf")
        self.seen_running = False  # a poll saw it in flight: its completion time is exact
        self.busy_s = 0.0  # once finished: from when the device could start it to its end
        self.wall: float | None = None
        self.error: DeviceError | None = None

    @property
    def done(self) -> bool:
        return self.wall is not None or self.error is not None

    def wait(self, deadline: float | None = None) -> float:
        return self.device.wait(self, deadline)

    def finished(self) -> bool:
        return self.device.finished(self)


@dataclass
class Parked:
    """A context taken out of use with a dispatch hung (or abandoned) on it: its launches and
    every device object they touch, kept referenced so that no destructor runs on them while
    they may still be in use by the device."""

    key: str
    ctx: Any
    launches: list[DeviceLaunch]
    objects: list[Any]
    at: float


_kept_forever: list[Any] = []


def keep_forever(obj: Any) -> None:
    """Never let obj (and what it references) be destroyed, not even at interpreter exit:
    a reference here and one the interpreter never gives back (its destructors may block
    in the driver on a hung device)."""
    _kept_forever.append(obj)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


K = TypeVar("K", bound=LoadedKernel)


B = TypeVar("B", bound=Buffer)


class DeviceCore(Generic[K, B]):
    """The bookkeeping XrtDevice and SimDevice share, behind one internal lock.

    Kernels are listed by context key (`_users`); a context's last kernel freed frees the
    context, and a context evicted from the ContextCache unloads its kernels' device objects
    (they come back on the next run, patches re-applied). Buffers are tracked by id until
    freed. A subclass supplies the backend's part through the hooks below; its kernels carry
    `spec`, `patches`, `timing`, `pending` and `freed`.

    Waits (wait(), run(), run_all()) follow `waits` (a WaitPolicy): they sleep and poll the
    run's state without holding the device lock or the GIL in between. A dispatch past its
    deadline is hung: it and every launch queued on its context fail with DeviceTimeout,
    the context and the objects those launches touch are parked (kept, never destroyed,
    until the backend reports every parked run finished), and the kernel is reloaded in a
    fresh context. The device is marked failed (`failed`, DeviceFailed on every later
    dispatch) when a context hangs again after its reload or more than
    `waits.max_parked` contexts are parked. interrupt() gives up every wait at once.
    """

    backend: str
    label: str  # the device's name in messages and in its TACONITE_TIMING line

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.stats = DeviceStats()
        self._timing = timing_enabled()
        self._users: dict[str, list[K]] = {}
        self._contexts = ContextCache(
            ctx_cache_cap(), self._create_context, self._release_context, self.stats,
            holders=self._context_holders, cost=self._context_cost,
        )  # fmt: skip
        self._cap = self._contexts.cap
        self._buffers: dict[int, B] = {}
        self.closed = False
        self.waits = WaitPolicy()
        self.failed: str | None = None  # why the device was marked failed
        self._parked: list[Parked] = []
        self._releasing: dict[str, Any] = {}  # contexts being released, by key
        self._suspect: set[str] = set()  # contexts reloaded after a hang, not yet proven
        self._queue_end = 0.0  # when the last dispatch submitted should end
        self._last_done = 0.0  # when a wait last saw a dispatch finish
        self._in_flight = 0
        self._next_reap = 0.0
        self._interrupted = threading.Event()
        self._interrupt_reason = ""

    # hooks

    def _create_context(self, key: str) -> Any:
        """Create the hardware context of a context key (ContextCache's create)."""
        raise NotImplementedError

    def _destroy_context(self, key: str, ctx: Any) -> None:
        """Free a context whose kernels were already unloaded."""
        raise NotImplementedError

    def _new_kernel(self, spec: KernelSpec) -> K:
        """Validate a spec and make its (not yet resident) kernel."""
        raise NotImplementedError

    def _resident(self, kernel: K) -> None:
        """Make the kernel's context resident and its device objects live."""
        raise NotImplementedError

    def _unload(self, kernel: K) -> None:
        """Drop the kernel's device objects (its context is going, or it is freed; its
        launches have finished)."""
        raise NotImplementedError

    def _patch(self, kernel: K, words: list[tuple[int, int]]) -> None:
        """Apply checked instruction patches to the kernel's live stream, if it has one."""
        raise NotImplementedError

    def _new_buffer(self, nbytes: int) -> B:
        """A zeroed root buffer of nbytes (nbytes >= 1)."""
        raise NotImplementedError

    def _new_sub(self, root: Buffer, offset: int, nbytes: int) -> B:
        """A sub-buffer [offset, +nbytes) of a root (range already checked)."""
        raise NotImplementedError

    def _drop_buffers(self, gone: list[Buffer]) -> None:
        """Mark buffers freed and stop tracking them (and drop what uses them)."""
        raise NotImplementedError

    def start(self, kernel: K, buffers: Sequence[Buffer]) -> Launch:
        """Start a run of kernel over the argument buffers (_check_usable, then queue it and
        call _submitted)."""
        raise NotImplementedError

    def _state(self, launch: Any) -> int:
        """The launch's ert_cmd_state value now; never blocks."""
        raise NotImplementedError

    def _retired(self, launch: Any) -> None:
        """A launch has finished and was waited for: drop its one-off handles."""

    def _park(self, key: str, ctx: Any, kernels: list[K], launches: list[Any]) -> list[Any]:
        """Take a context with a hung dispatch out of use: detach its kernels' device
        objects (they are rebuilt on the next run) and replace the buffers the launches
        touch; return every object to keep alive instead of destroying."""
        raise NotImplementedError

    def _release_parked(self, parked: Parked) -> None:
        """Every run of a parked context has finished: give back what it holds."""

    def _close_parked(self) -> bool:
        """close() with contexts parked: whether to tear the rest down as usual."""
        return True

    def _shutdown(self) -> None:
        """Release what the backend holds beyond kernels, contexts and buffers."""

    def _context_holders(self) -> str:
        """Who holds the machine's other contexts, for the "all taken" error ("" unknown)."""
        return ""

    def _context_cost(self, wall: float) -> float:
        """The seconds a context creation that took `wall` is counted as."""
        return wall

    def set_context_wait(self, waits: int, wait_s: float = CONTEXT_WAIT_S) -> None:
        """How long a load waits for slots other processes hold: waits x wait_s seconds."""
        self._contexts.waits, self._contexts.wait_s = waits, wait_s

    def _timing_lines(self) -> list[str]:
        return [self.stats.line(self.label)]

    # contexts and kernels

    def _release_context(self, key: str, ctx: Any) -> None:
        """Unload a context's kernels and free it, once its launches have finished; if one
        of them hangs meanwhile, the context is parked instead."""
        self._releasing[key] = ctx
        try:
            for kernel in list(self._users.get(key, [])):
                self._settle(kernel)
        finally:
            kept = self._releasing.pop(key, None)
        if kept is None:
            return  # parked while its launches were waited for
        for kernel in self._users.get(key, []):
            self._unload(kernel)
        self._destroy_context(key, ctx)

    def load(self, spec: KernelSpec) -> K:
        """Load a kernel: share or create its context (LRU), upload its instructions."""
        with self._lock:
            self._check_usable()
            kernel = self._new_kernel(spec)
            kernel.timing = self.stats.kernels.setdefault(spec.key, kernel.timing)
            self._users.setdefault(spec.context_key, []).append(kernel)
            try:
                self._resident(kernel)
            except BaseException:
                self._forget(kernel)
                raise
            return kernel

    def _forget(self, kernel: K) -> None:
        key = kernel.spec.context_key
        users = self._users.get(key, [])
        if kernel in users:
            users.remove(kernel)
        if not users:
            self._users.pop(key, None)
            self._contexts.drop(key)

    def free_kernel(self, kernel: K) -> None:
        with self._lock:
            if kernel.freed:
                return
            self._settle(kernel)
            self._unload(kernel)
            kernel.freed = True
            self._forget(kernel)

    def resident_contexts(self) -> list[str]:
        """Context keys resident now, least recently used first."""
        return self._contexts.keys()

    def context_view(self) -> dict[str, ModelContexts]:
        """Each model's (kernel owner's) share of the context budget: what is resident,
        what it loaded at what cost, who evicted its contexts, how long it waited."""
        with self._lock:
            return self._contexts.view()

    @property
    def parked_contexts(self) -> int:
        """Contexts parked with a hung (or abandoned) dispatch, not yet given back."""
        return len(self._parked)

    def set_insts_words(self, kernel: K, words: Iterable[tuple[int, int]]) -> None:
        with self._lock:
            spec = kernel.spec
            checked = check_insts_words(len(spec.insts), words)
            if kernel.pending:
                raise DeviceError(f"{spec.key}: instruction patch while a launch is in flight")
            kernel.patches.update(checked)
            self._patch(kernel, checked)

    # buffers

    def alloc(self, nbytes: int) -> B:
        """A zeroed host-mapped data buffer of nbytes."""
        with self._lock:
            self._check_open()
            if nbytes <= 0:
                raise DeviceError(f"a buffer needs at least one byte, asked for {nbytes}")
            buf = self._new_buffer(nbytes)
            self._buffers[buf.id] = buf
            return buf

    def sub(self, buf: Buffer, offset: int, nbytes: int) -> B:
        """A sub-buffer [offset, +nbytes) of buf, always cut from buf's root."""
        with self._lock:
            buf.check_live()
            check_sub_range(buf.nbytes, offset, nbytes)
            root = buf.root
            sub = self._new_sub(root, buf.offset + offset, nbytes)
            root.subs.append(sub)
            self._buffers[sub.id] = sub
            return sub

    def free(self, buf: Buffer) -> None:
        """Free a buffer (and its sub-buffers, if it is a root)."""
        with self._lock:
            self._drop_buffers([buf, *(buf.subs if buf.root is buf else [])])
            if buf.root is not buf and buf in buf.root.subs:
                buf.root.subs.remove(buf)

    # runs

    def _count_run(self, kernel: K, wall: float, waited: float) -> None:
        """Add one finished dispatch to the device's and the kernel's wall-clock counters."""
        for timing in (self.stats, kernel.timing):
            timing.runs += 1
            timing.run_s += wall
            timing.wait_s += waited

    def _submitted(
        self,
        launch: DeviceLaunch,
        expected_s: float,
        *,
        paced: bool,
        begin: float | None = None,
    ) -> None:
        """Register a launch just started: its expected time, when the device should begin
        it (default: at once if nothing is in flight, else when the dispatches queued before
        it should end), its wait's wake-up and its deadline."""
        launch.kernel.pending.append(launch)
        if begin is None:
            begin = max(launch.t_start, self._queue_end) if self._in_flight else launch.t_start
        self._in_flight += 1
        w = self.waits
        launch.expected_s, launch.begin = expected_s, begin
        self._queue_end = begin + expected_s
        launch.deadline = begin + w.deadline_after(expected_s)
        launch.fast_until = begin + 2 * expected_s
        if paced and expected_s >= w.min_pace_s:
            launch.wake_at = begin + w.pace * expected_s

    def run(self, kernel: K, buffers: Sequence[Buffer]) -> float:
        """start + wait: the wall seconds of the dispatch."""
        return self.start(kernel, buffers).wait()

    def run_all(self, dispatches: Iterable[tuple[K, Sequence[Buffer]]], depth: int = 2) -> float:
        """Run dispatches that need no host work between them (syncs, patches) with up to
        `depth` in flight: dispatch N+1 is queued on the device before N is waited for, so
        the device never idles while a wait notices N's end. Waited in order; wall seconds
        of the whole. On an error the launches already started are waited for, then the
        first error is raised."""
        if depth < 1:
            raise DeviceError(f"run_all: depth {depth} < 1")
        t0 = time.perf_counter()
        window: deque[Launch] = deque()
        try:
            for kernel, buffers in dispatches:
                if len(window) >= depth:
                    window.popleft().wait()
                window.append(self.start(kernel, buffers))
            while window:
                window.popleft().wait()
        except BaseException:
            for launch in window:
                with contextlib.suppress(DeviceError):  # the first error is the one raised
                    launch.wait()
            raise
        return time.perf_counter() - t0

    def finished(self, launch: DeviceLaunch) -> bool:
        """Whether a launch has finished (Launch.finished): one read of its state, never a
        wait; a finished launch is retired as its wait would retire it."""
        with self._lock:
            if launch.done:
                return True
            now = time.perf_counter()
            try:
                state = self._state(launch)
            except Exception:
                return True  # its wait reports the failure
            if state in IN_FLIGHT_STATES:
                launch.seen_running = True
                return False
            self._retire(launch, now, state=state)
            return True

    def wait(self, launch: DeviceLaunch, deadline: float | None = None) -> float:
        """Wait for a launch (Launch.wait): its wall seconds, or its error raised."""
        if not launch.done:
            self._await(launch, launch.deadline if deadline is None else deadline)
        if launch.error is not None:
            raise launch.error
        assert launch.wall is not None
        return launch.wall

    def _await(self, launch: DeviceLaunch, deadline: float) -> None:
        """Sleep to the launch's wake-up, then poll its state until it finishes, passes
        `deadline` (hung) or the device is interrupted. Only the polls take the lock."""
        pause = launch.wake_at - time.perf_counter()
        if pause > 0:
            self._interrupted.wait(pause)
        w = self.waits
        while True:
            with self._lock:
                if launch.done:
                    return
                now = time.perf_counter()
                try:
                    state = self._state(launch)
                except Exception as exc:
                    self._retire(launch, now, error=f"reading the run state failed: {exc}")
                    return
                if state not in IN_FLIGHT_STATES:
                    self._retire(launch, now, state=state)
                    return
                launch.seen_running = True
                if self._interrupted.is_set():
                    self._abandon(launch, now)
                    return
                if now >= deadline:
                    self._hung(launch, now, deadline)
                    return
            time.sleep(w.poll_s if now < launch.fast_until else w.slow_poll_s)

    def _unqueue(self, launch: DeviceLaunch) -> None:
        pending = launch.kernel.pending
        if launch in pending:
            pending.remove(launch)
            self._in_flight -= 1

    def _retire(
        self, launch: DeviceLaunch, now: float, state: int | None = None, error: str = ""
    ) -> None:
        """A launch finished with `state` (or its state could not be read: `error`)."""
        kernel = launch.kernel
        self._unqueue(launch)
        self._retired(launch)
        wall = now - launch.t0
        self._count_run(kernel, wall, now - launch.t_start)
        began = max(launch.t_start, self._last_done)
        self._last_done = max(self._last_done, now)
        launch.busy_s = max(0.0, now - began)
        if state == ERT_CMD_STATE_COMPLETED:
            kernel.timing.learn(now - began, exact=launch.seen_running)
            self._suspect.discard(kernel.spec.context_key)
            launch.wall = wall
        elif error:
            launch.error = DeviceError(f"{kernel.spec.key}: {error}")
        else:
            launch.error = DeviceError(f"kernel finished in state {state}")

    def _settle(self, kernel: K) -> None:
        """Wait for the kernel's launches in flight (their errors stay with the launches)."""
        for launch in list(kernel.pending):
            if not launch.done:
                self._await(launch, launch.deadline)

    def _park_context(self, key: str, launches: list[DeviceLaunch], now: float) -> None:
        """Take context `key` out of use with `launches` (every launch in flight on it)."""
        ctx = self._contexts.take(key)
        if ctx is None:
            ctx = self._releasing.pop(key, None)
        for launch in launches:
            self._unqueue(launch)
        kernels = list(self._users.get(key, []))
        objects = self._park(key, ctx, kernels, launches)
        self._parked.append(Parked(key, ctx, launches, objects, now))
        self._contexts.cap = max(1, self._cap - len(self._parked))
        while len(self._contexts.keys()) > self._contexts.cap:
            self._contexts.evict_lru()

    def _hung(self, launch: DeviceLaunch, now: float, deadline: float) -> None:
        """A dispatch passed its deadline: fail it and the launches queued on its context,
        park the context, reload the kernel in a fresh one, or mark the device failed."""
        kernel = launch.kernel
        spec = kernel.spec
        key = spec.context_key
        self.stats.timeouts += 1
        victims = [v for k in self._users.get(key, []) for v in k.pending]
        if launch not in victims:
            victims.append(launch)
        message = (
            f"{spec.where()}: dispatch of {spec.key} not done {now - launch.begin:.3f} s after "
            f"it began, past its deadline of {deadline - launch.begin:.3f} s (expected "
            f"{launch.expected_s * 1e3:.3f} ms); its context was parked"
        )
        again = key in self._suspect
        self._park_context(key, victims, now)
        for other in victims:
            if other is not launch:
                other.error = DeviceTimeout(
                    f"{other.kernel.spec.key}: queued on the context of a hung dispatch "
                    f"({spec.key}); parked with it"
                )
        if again or len(self._parked) > self.waits.max_parked:
            why = (
                f"{spec.key} hung again after its context was reloaded"
                if again
                else f"{len(self._parked)} contexts parked with hung dispatches"
            )
            self.failed = why
            launch.error = DeviceFailed(
                f"{message}; the {self.label} device is marked failed: {why}"
            )
            log.error("%s", launch.error)
            return
        self._suspect.add(key)
        try:
            self._resident(kernel)
            message += " and the kernel reloaded in a fresh context"
        except DeviceError as exc:
            message += f"; reloading the kernel failed ({exc}), retried on its next dispatch"
        launch.error = DeviceTimeout(message)
        log.warning("%s", message)

    def _abandon(self, launch: DeviceLaunch, now: float) -> None:
        """interrupt(): give up a launch still in flight; its context is parked."""
        key = launch.kernel.spec.context_key
        victims = [v for k in self._users.get(key, []) for v in k.pending]
        if launch not in victims:
            victims.append(launch)
        self._park_context(key, victims, now)
        for v in victims:
            v.error = DeviceInterrupted(
                f"{v.kernel.spec.key}: dispatch abandoned in flight ({self._interrupt_reason})"
            )

    def interrupt(self, reason: str) -> None:
        """Give up every wait at once (from any thread; at shutdown): launches in flight
        fail with DeviceInterrupted and their contexts are parked; later dispatches fail."""
        self._interrupt_reason = reason
        self._interrupted.set()

    def _reap(self) -> None:
        """Give back parked contexts whose runs have all finished (the driver's job timeout
        ended them); at most every 0.5 s."""
        now = time.perf_counter()
        if not self._parked or now < self._next_reap:
            return
        self._next_reap = now + 0.5
        for parked in list(self._parked):
            try:
                finished = all(self._state(v) not in IN_FLIGHT_STATES for v in parked.launches)
            except Exception:
                continue
            if finished:
                self._parked.remove(parked)
                self._release_parked(parked)
                log.info("%s: a parked context's runs finished; released", self.label)
        self._contexts.cap = max(1, self._cap - len(self._parked))

    def _check_open(self) -> None:
        if self.closed:
            raise DeviceError(f"the {self.label} device is closed")

    def _check_usable(self) -> None:
        """Open, not interrupted and not marked failed; else the DeviceError saying which."""
        self._check_open()
        if self._interrupted.is_set():
            raise DeviceInterrupted(
                f"the {self.label} device is stopping ({self._interrupt_reason})"
            )
        if self.failed is not None:
            raise DeviceFailed(f"the {self.label} device is marked failed: {self.failed}")

    def close(self) -> None:
        """Free every kernel, buffer and context; print the TACONITE_TIMING line(s) if on.
        With contexts parked the backend decides what may still be torn down."""
        with self._lock:
            if self.closed:
                return
            kernels = [k for ks in self._users.values() for k in ks]
            for kernel in kernels:
                self._settle(kernel)
            if not self._parked or self._close_parked():
                for kernel in [k for ks in self._users.values() for k in ks]:
                    self.free_kernel(kernel)
                self._contexts.clear()
                self._drop_buffers(list(self._buffers.values()))
                self._shutdown()
            self.closed = True
            if self._timing:
                for line in self._timing_lines():
                    print(line, file=sys.stderr)
