"""A recording fake of XRT's pyxrt module that blocks like the real one (Xilinx/XRT
src/python/pybind11/src/pyxrt.cpp; docs/device.md, "The test fake pyxrt").

Tests inject it with `monkeypatch.setitem(sys.modules, "pyxrt", fake_pyxrt)` after reset();
a subprocess gets it through tests/npu/pyxrt_shim (configure() from $NPUCAM_FAKE_PYXRT).
Every call except state() lands in `calls` as a tuple while `record` is on (the default;
state() polls are counted in `state_calls`) and is counted by name in `counts` always. The
log is bounded: a recording run past `max_calls` calls fails with RuntimeError, so a long
run (a paced test, a bench, a subprocess through the shim, whose calls nobody reads) turns
`record` off and keeps only the counts. Hardware contexts count against a machine-wide
`limit` and free their slot when garbage-collected, as a released xrt::hw_context does; a
full machine raises RuntimeError mentioning CREATE_HWCTX, as the amdxdna driver does.

Ordering, as the amdxdna driver orders runs (torvalds/linux drivers/accel/amdxdna/aie2_ctx.c:
`aie2_hwctx_init` gives every hardware context its own DRM scheduler, and `aie2_cmd_submit`
adds a job's fence to its BOs' reservation objects without waiting on the fences already
there; pyxrt's `run.start()` passes no dependency):
- Runs on one hw_context execute in submission order, one after another; each context is its
  own timeline, so runs on different contexts may overlap in time.
- A run started on one context while a run on ANOTHER context that the host has not yet seen
  finish (its wait() returned, or its state() read, a final state) touches the same bytes of
  the same root BO (sub-BOs resolved to their root's byte ranges), at least one of the two
  writing them, is a hazard: the device could read before the producer wrote, or write
  under the consumer's feet. It is appended to `hazards` (a Hazard: both runs, their
  xclbins, the root BO and byte range) and the run started ends in ERT_CMD_STATE_ERROR, so
  npucam fails the job loudly (unless `fail_hazards` is off: a benchmark's reference run of
  the unordered chaining, whose hazards are then only recorded). The model is
  happens-before, not timing: it flags the same runs however fast the emulated device is.
- A kernel writes its last BO argument (IRON's convention: a GEMM's C, an MHA's o, a conv's
  output) unless `writes` names other positions among its BO arguments (negative: from the
  end) for a substring of its xclbin path; CLIP's `addln` (X, D, Y, H) writes Y and H.
- A host sync FROM_DEVICE of bytes a not-yet-seen-finished run writes, or TO_DEVICE of bytes
  such a run reads or writes, is a hazard too: recorded, and the sync raises RuntimeError.

Timing, as the bindings behave (none of these calls releases the GIL):
- `run.start()` returns at once; a run executes after the runs before it on its context,
  for `dispatch_time(xclbin path)` seconds (`dispatch_s`, first matching substring, else
  `default_dispatch_s`; 0 by default, so plain tests run instantly). With `serial` on, every
  context shares one timeline instead (one array time-slicing contexts that each take all
  its columns, as a throughput model); ordering and hazards are the same either way.
- `run.state()` is NEW (1) before a start, SUBMITTED (7) while queued behind another run,
  RUNNING (3) while it runs, then its final state (COMPLETED, or the next of `next_states`).
  pyxrt's enum has no RUNNING member: 3 comes back as an unnamed value (`int()` of it is 3).
- `run.wait()` / `run.wait(timeout_ms)` sleep in libc through ctypes.PyDLL, which keeps the
  GIL, for the run's remaining device time (at most timeout_ms; then TIMEOUT, 8).
- A hung run (`hang_next` starts, or any start while the file `hang_file` exists, which is
  then removed) never completes: state() stays RUNNING (until `tdr_s`, the driver's job
  timeout, if set: then TIMEOUT), runs queued behind it on its context never complete
  either, and wait() on it blocks forever with the GIL held. Destroying a run or hw_context
  with a hung run in flight blocks forever too (pybind11 runs destructors with the GIL), so
  code that lets one be collected freezes, as it would on hardware.
- `bo.map()` keeps no owner: once a root BO is collected its memory reads 0xEE.
- `kernel(...)` called with arguments builds a new run per call, silently skips arguments
  that are neither a bo nor an int, and starts it (pyxrt's `__call__`).
"""

from __future__ import annotations

import atexit
import ctypes
import enum
import itertools
import json
import os
import signal
import time
import weakref
from collections import Counter
from typing import Any, NamedTuple

import numpy as np

calls: list[tuple[Any, ...]] = []
record = True  # append every call to `calls`; off: only count them in `counts`
max_calls = 500_000  # a recording run past this many calls fails (turn `record` off)
counts: Counter[str] = Counter()
live_contexts: set[int] = set()
limit = 16
fail_contexts = 0  # the next n hw_context creations raise a non-"full" error
next_states: list[int] = []  # final states of the next runs started (default COMPLETED)
dispatch_s: dict[str, float] = {}  # xclbin path substring -> emulated device seconds
default_dispatch_s = 0.0
hang_next = 0  # the next n run starts hang
hang_file: str | None = None  # a start while this file exists hangs (and removes it)
tdr_s: float | None = None  # a hung run ends in TIMEOUT after this long (None: never)
state_calls = 0
timeline: list[tuple[int, float, float]] = []  # (run id, begin, end) of every start
run_xclbin: dict[int, str] = {}  # run id -> the xclbin path of its context (every start)
serial = False  # every context on one timeline (a throughput model), not one each
fail_hazards = True  # a run that races another ends in ERROR (off: hazards only recorded)
_serial_until = 0.0  # with `serial`: when the last run queued on the device ends
DEFAULT_WRITES: dict[str, tuple[int, ...]] = {"addln": (-2, -1)}
writes: dict[str, tuple[int, ...]] = dict(DEFAULT_WRITES)  # xclbin substring -> BO args written
# started runs the host has not yet seen finish, by id; weak, so that dropping a run (and its
# context) still runs their destructors
_unseen: weakref.WeakValueDictionary[int, run] = weakref.WeakValueDictionary()
_ids = itertools.count(1)
_generation = 0  # reset() starts a new one: ids restart, so objects of an older one are stale


class Hazard(NamedTuple):
    """Two device accesses to the same bytes not ordered by the driver or the host. `run`
    started (or the host synced, `run` None) while `other` (a run on another context not yet
    seen finished) was in flight; `what` says which side writes. bo: the root BO's id;
    lo, hi: the overlapping byte range of its storage."""

    what: str
    run: int | None
    xclbin: str
    other: int
    other_xclbin: str
    bo: int
    lo: int
    hi: int


hazards: list[Hazard] = []

_libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held across the call, as in pyxrt
_libc.usleep.argtypes = [ctypes.c_uint]
_libc.usleep.restype = ctypes.c_int
FOREVER_US = 4_000_000_000  # one usleep of ~67 minutes


def reset(hwctx_limit: int = 16) -> None:
    global limit, fail_contexts, _ids, default_dispatch_s, hang_next, hang_file, tdr_s, _generation
    global state_calls, record, serial, _serial_until, fail_hazards
    calls.clear()
    counts.clear()
    record = True
    live_contexts.clear()
    next_states.clear()
    dispatch_s.clear()
    limit = hwctx_limit
    fail_contexts = 0
    default_dispatch_s = 0.0
    hang_next = 0
    hang_file = None
    tdr_s = None
    state_calls = 0
    timeline.clear()
    run_xclbin.clear()
    serial, _serial_until, fail_hazards = False, 0.0, True
    writes.clear()
    writes.update(DEFAULT_WRITES)
    hazards.clear()
    _unseen.clear()
    _ids = itertools.count(1)
    _generation += 1


def configure(settings: dict[str, Any]) -> None:
    """Set the timing knobs from a dict: dispatch_s ({substring: s}), default_dispatch_s,
    hang_next, hang_file, tdr_s, limit, serial, writes ({substring: [positions]}); timeline_file:
    where to write `timeline` (JSON) at exit; record_calls (default off: a subprocess's call
    log is never read)."""
    global default_dispatch_s, hang_next, hang_file, tdr_s, limit, record, serial
    record = bool(settings.get("record_calls", False))
    if settings.get("timeline_file"):
        atexit.register(_write_timeline, settings["timeline_file"])
    dispatch_s.update(settings.get("dispatch_s", {}))
    default_dispatch_s = float(settings.get("default_dispatch_s", default_dispatch_s))
    hang_next = int(settings.get("hang_next", hang_next))
    hang_file = settings.get("hang_file", hang_file)
    tdr_s = settings.get("tdr_s", tdr_s)
    limit = int(settings.get("limit", limit))
    writes.update({k: tuple(v) for k, v in settings.get("writes", {}).items()})
    serial = bool(settings.get("serial", serial))


def _write_timeline(path: str) -> None:
    with open(path, "w") as fh:
        json.dump(timeline, fh)


def _log(*call: Any) -> None:
    counts[call[0]] += 1
    if not record:
        return
    if len(calls) >= max_calls:
        raise RuntimeError(
            f"fake pyxrt: {max_calls} calls recorded; a long run sets fake_pyxrt.record = "
            "False (calls are still counted in `counts`)"
        )
    calls.append(call)


def of(name: str) -> list[tuple[Any, ...]]:
    """The recorded calls named `name` (RuntimeError when not recording: they were not kept)."""
    if not record:
        raise RuntimeError("fake pyxrt: calls are not being recorded (record is off)")
    return [c for c in calls if c[0] == name]


def gil_sleep(seconds: float) -> None:
    """Sleep in C without releasing the GIL, as a blocking pyxrt call does."""
    if seconds > 0:
        _libc.usleep(min(int(seconds * 1e6), FOREVER_US))


def block_forever() -> None:
    """A C call that never returns, GIL held; this thread's signals are blocked, so a
    signal cannot cut the sleep short (the process's handlers then never run)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    while True:
        _libc.usleep(FOREVER_US)


def dispatch_time(path: str) -> float:
    for part, seconds in dispatch_s.items():
        if part in path:
            return float(seconds)
    return default_dispatch_s


class xclBOSyncDirection(enum.IntEnum):  # noqa: N801 (pyxrt's spelling)
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1


class ert_cmd_state(enum.IntEnum):  # noqa: N801
    """pyxrt's binding of ert.h's ert_cmd_state: RUNNING (3) is not bound."""

    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_SUBMITTED = 7
    ERT_CMD_STATE_TIMEOUT = 8
    ERT_CMD_STATE_NORESPONSE = 9
    ERT_CMD_STATE_SKERROR = 10
    ERT_CMD_STATE_SKCRASHED = 11

    @classmethod
    def _missing_(cls, value: object) -> ert_cmd_state:
        """An unbound value (3) comes back unnamed, as pybind11's `<ert_cmd_state.???: 3>`."""
        pseudo = int.__new__(cls, value)
        pseudo._name_ = "???"
        pseudo._value_ = value
        return pseudo


RUNNING = 3
IN_FLIGHT = (1, 2, 3, 7)  # NEW, QUEUED, RUNNING, SUBMITTED: every other state is final


class uuid:  # noqa: N801
    def __init__(self, path: str) -> None:
        self.path = path


class _KernelInfo:
    def get_name(self) -> str:
        return "MLIR_AIE"


class xclbin:  # noqa: N801
    def __init__(self, path: str) -> None:
        if path.endswith("corrupt.xclbin"):
            raise RuntimeError(f"{path}: not a valid xclbin")
        self.path = path
        _log("xclbin", path)

    def get_kernels(self) -> list[_KernelInfo]:
        return [_KernelInfo()]


class device:  # noqa: N801
    def __init__(self, index: int) -> None:
        _log("device", index)

    def register_xclbin(self, xb: xclbin) -> uuid:
        _log("register_xclbin", xb.path)
        return uuid(xb.path)


class hw_context:  # noqa: N801
    def __init__(self, dev: device, id_: uuid) -> None:
        global fail_contexts
        if fail_contexts:
            fail_contexts -= 1
            _log("hw_context.fail", id_.path)
            raise ValueError("xclbin is corrupt")
        if len(live_contexts) >= limit:
            _log("hw_context.full", id_.path)
            raise RuntimeError(
                "DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-16): Device or resource busy"
            )
        self.id, self.generation = next(_ids), _generation
        self.path = id_.path
        self.hung: run | None = None  # a hung run in flight on this context
        self.busy_until = 0.0  # when the last run queued on this context ends
        live_contexts.add(self.id)
        _log("hw_context", id_.path)

    def __del__(self) -> None:
        hung = getattr(self, "hung", None)
        if hung is not None and hung.in_flight():
            _log("hw_context.free_blocked", self.path)
            block_forever()  # the driver waits for the outstanding job
        # a context of before the last reset() (collected late) must not free a new one's id
        if getattr(self, "generation", None) == _generation and self.id in live_contexts:
            live_contexts.discard(self.id)
            _log("hw_context.free", self.path)


class kernel:  # noqa: N801
    def __init__(self, ctx: hw_context, name: str) -> None:
        self.ctx = ctx
        self.name = name
        _log("kernel", ctx.path, name)

    def group_id(self, i: int) -> int:
        return 100 + i  # distinct from i, so a test sees that the kernel was asked

    def __call__(self, *args: Any) -> run:
        """pyxrt's kernel.__call__: a new run per call, args set by position (anything not
        a bo or an int is skipped without an error), started."""
        r = run(self)
        for i, value in enumerate(args):
            if isinstance(value, (bo, int)) and not isinstance(value, bool):
                r.set_arg(i, value)
        r.start()
        return r


class bo:  # noqa: N801
    normal = 0
    cacheable = 1 << 24
    host_only = 1 << 29

    def __init__(self, *args: Any) -> None:
        self.id = next(_ids)
        if isinstance(args[0], bo):
            parent, size, offset = args
            self.parent, self.offset = parent, offset
            self.storage, self.root = parent.storage, parent.root
            self.base = parent.base + offset  # a sub of a sub takes its host pointer this way
            _log("bo.sub", parent.id, size, offset, self.id)
        else:
            _, size, flags, group = args
            self.parent, self.offset, self.base, self.root = None, 0, 0, self
            self.storage = np.full(size, 0xAB, np.uint8)  # not zeroed: the device must zero
            _log("bo", size, flags, group, self.id)
        self.nbytes = size

    def map(self) -> memoryview:
        return memoryview(self.storage[self.base : self.base + self.nbytes])

    def write(self, data: Any, offset: int) -> None:
        raw = np.frombuffer(bytes(data), np.uint8)
        self.storage[self.base + offset : self.base + offset + raw.size] = raw
        _log("bo.write", self.id, raw.size, offset)

    def sync(self, direction: xclBOSyncDirection, *rest: int) -> None:
        """rest: (size, offset) of a partial sync, as pyxrt's bo.sync(dir, size, offset)."""
        name = xclBOSyncDirection(direction).name
        _log("sync", self.id, name, *rest)
        size, offset = (rest + (self.nbytes, 0)[len(rest) :])[:2]
        lo = self.base + offset
        from_device = direction == xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE
        for other in list(_unseen.values()):
            for root, o_lo, o_hi, written in other.footprint:
                if (
                    root is self.root
                    and o_lo < lo + size
                    and lo < o_hi
                    and (written or not from_device)
                ):
                    hazard = Hazard(
                        f"host sync {name} of bytes run {other.id} "
                        f"{'writes' if written else 'reads'}",
                        None, "", other.id, other.kernel.ctx.path, root.id,
                        max(lo, o_lo), min(lo + size, o_hi),
                    )  # fmt: skip
                    hazards.append(hazard)
                    raise RuntimeError(f"fake pyxrt: {hazard}")

    def size(self) -> int:
        return self.nbytes

    def __del__(self) -> None:
        if getattr(self, "parent", 0) is None:  # a root: its memory goes back to the driver
            self.storage[:] = 0xEE


def _take_hang() -> bool:
    global hang_next
    if hang_next > 0:
        hang_next -= 1
        return True
    if hang_file is not None:
        try:
            os.unlink(hang_file)
        except FileNotFoundError:
            return False
        with open(hang_file + ".started", "w") as fh:
            fh.write(str(time.time_ns()))
        return True
    return False


class run:  # noqa: N801
    def __init__(self, k: kernel) -> None:
        self.id = next(_ids)
        self.kernel = k
        self.args: dict[int, Any] = {}
        self.t_start = self.begin = self.end = 0.0
        self.started = False
        self.hung = False
        self.final = ert_cmd_state.ERT_CMD_STATE_COMPLETED
        self.footprint: list[tuple[bo, int, int, bool]] = []  # (root, lo, hi, written)
        _log("run", self.id, k.name)

    def set_arg(self, i: int, value: Any) -> None:
        self.args[i] = value
        shown = value.id if isinstance(value, bo) else value
        _log("set_arg", self.id, i, type(value).__name__, shown)

    def in_flight(self) -> bool:
        return self.started and int(self._state()) in IN_FLIGHT

    def _footprint(self) -> list[tuple[bo, int, int, bool]]:
        """The bytes each BO argument covers in its root, and whether the kernel writes it."""
        bos = [v for _, v in sorted(self.args.items()) if isinstance(v, bo)]
        path = self.kernel.ctx.path
        positions = next((w for part, w in writes.items() if part in path), (-1,))
        written = {p % len(bos) for p in positions} if bos else set()
        return [(b.root, b.base, b.base + b.nbytes, i in written) for i, b in enumerate(bos)]

    def _hazards(self) -> list[Hazard]:
        """This run's accesses against those of unseen runs on other contexts."""
        found = []
        for other in _unseen.values():
            if other.kernel.ctx is self.kernel.ctx:
                continue  # one context: the driver runs them in submission order
            for root, lo, hi, written in self.footprint:
                for o_root, o_lo, o_hi, o_written in other.footprint:
                    if root is o_root and lo < o_hi and o_lo < hi and (written or o_written):
                        what = "writes" if written else "reads"
                        found.append(Hazard(
                            f"run {self.id} {what} bytes run {other.id} on another context "
                            f"{'writes' if o_written else 'reads'}",
                            self.id, self.kernel.ctx.path, other.id, other.kernel.ctx.path,
                            root.id, max(lo, o_lo), min(hi, o_hi),
                        ))  # fmt: skip
        return found

    def _seen(self, state: ert_cmd_state) -> ert_cmd_state:
        """The host read `state`: a final one orders this run before what the host does next."""
        if int(state) not in IN_FLIGHT:
            _unseen.pop(self.id, None)
        return state

    def start(self) -> None:
        global _serial_until
        if self.in_flight():
            raise RuntimeError(f"run {self.id} started while in flight")
        _log("start", self.id)
        now = time.perf_counter()
        ctx = self.kernel.ctx
        self.started, self.t_start = True, now
        self.final = (
            ert_cmd_state(next_states.pop(0))
            if next_states
            else ert_cmd_state.ERT_CMD_STATE_COMPLETED
        )
        self.footprint = self._footprint()
        found = self._hazards()
        if found:
            hazards.extend(found)
            if fail_hazards:
                self.final = ert_cmd_state.ERT_CMD_STATE_ERROR
        _unseen[self.id] = self
        behind_hung = ctx.hung is not None and ctx.hung.in_flight()
        self.hung = _take_hang() or behind_hung
        if self.hung:
            self.begin = self.end = float("inf")
            if not behind_hung:
                ctx.hung = self
                _log("hang", self.id)
            return
        self.begin = max(now, _serial_until if serial else ctx.busy_until)
        self.end = self.begin + dispatch_time(ctx.path)
        ctx.busy_until, _serial_until = self.end, max(_serial_until, self.end)
        timeline.append((self.id, self.begin, self.end))
        run_xclbin[self.id] = ctx.path

    def _state(self) -> ert_cmd_state:
        if not self.started:
            return ert_cmd_state.ERT_CMD_STATE_NEW
        now = time.perf_counter()
        if self.hung:
            if tdr_s is not None and now - self.t_start >= tdr_s:
                return ert_cmd_state.ERT_CMD_STATE_TIMEOUT
            return ert_cmd_state(RUNNING)
        if now < self.begin:
            return ert_cmd_state.ERT_CMD_STATE_SUBMITTED
        if now < self.end:
            return ert_cmd_state(RUNNING)
        return self.final

    def state(self) -> ert_cmd_state:
        global state_calls
        state_calls += 1
        return self._seen(self._state())

    def wait(self, timeout_ms: int = 0) -> ert_cmd_state:
        """wait() is wait(0): no timeout. wait(t) gives up after t ms with TIMEOUT (8)."""
        _log("wait", self.id, timeout_ms)
        if self.hung and tdr_s is None and timeout_ms == 0:
            block_forever()
        remaining = (self.t_start + tdr_s if self.hung else self.end) - time.perf_counter()
        gil_sleep(remaining if timeout_ms == 0 else min(remaining, timeout_ms / 1000))
        state = self._state()
        if int(state) in IN_FLIGHT:
            return ert_cmd_state.ERT_CMD_STATE_TIMEOUT
        return self._seen(state)

    def __del__(self) -> None:
        if getattr(self, "hung", False) and self.in_flight():
            _log("run.free_blocked", self.id)
            block_forever()
