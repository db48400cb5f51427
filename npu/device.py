"""The device protocol both NPU devices implement (XRT over pyxrt, and the simulator).

A device loads bundle kernels, allocates host-mapped buffers (and sub-buffers cut from a
root), patches instruction words and runs a kernel over an argument tuple. Kernels that
share an (xclbin, kernel name) share one hardware context, and resident contexts live in an
LRU capped at 16 (`TACONITE_CTX_CACHE`) with evict-and-retry when creation fails, as
taconite's shim and taconite-adaface do, then a bounded wait for slots other processes hold,
as taconite-sapiens2 does; each context is counted against the model that loaded it
(docs/device.md). `DeviceCore` holds the bookkeeping both devices share (which kernels use
which context, buffers, counters, teardown) and the wait every dispatch goes through: paced
`state()` polls that never block in a call holding the GIL, a per-dispatch deadline from the
record's expected time, and the recovery from a hung dispatch (its context parked, the kernel
reloaded; docs/inference.md, "Device waits"). Each device adds only what its backend does with
a context, a kernel, a buffer and a run.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from pipeline.errors import NpucamError

log = logging.getLogger(__name__)

DEFAULT_CTX_CACHE = 16
# taconite-sapiens2 npu.rs `WAITS` (50 at 465946c; 200 at 1e2c515): 100 ms waits for a slot
# other processes hold, once this process has no context of its own left to give up.
CONTEXT_WAITS = 50
CONTEXT_WAIT_S = 0.1
# ert_cmd_state values of XRT's ert.h; the simulator reports the same numbers. pyxrt's enum
# has no RUNNING member, so states are always compared by value.
ERT_CMD_STATE_NEW = 1
ERT_CMD_STATE_QUEUED = 2
ERT_CMD_STATE_RUNNING = 3
ERT_CMD_STATE_COMPLETED = 4
ERT_CMD_STATE_ERROR = 5
ERT_CMD_STATE_SUBMITTED = 7
ERT_CMD_STATE_TIMEOUT = 8
# not finished yet; every other value but COMPLETED is a failure (SUBMITTED is 7, so a
# dispatch is not done merely because its state is >= COMPLETED)
IN_FLIGHT_STATES = frozenset(
    {ERT_CMD_STATE_NEW, ERT_CMD_STATE_QUEUED, ERT_CMD_STATE_RUNNING, ERT_CMD_STATE_SUBMITTED}
)


class DeviceError(NpucamError):
    """A device could not be opened, a kernel could not be loaded or a run failed."""


class DeviceTimeout(DeviceError):
    """A dispatch passed its deadline: its job fails (`device_timeout`), its context is
    parked and its kernel reloaded in a fresh one."""


class DeviceFailed(DeviceTimeout):
    """The device is marked failed after hung dispatches (a reloaded kernel hung again, or
    too many contexts are parked): every later dispatch fails at once."""


class DeviceInterrupted(DeviceError):
    """The device is stopping (interrupt()): waits in progress were given up."""


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


def ctx_cache_cap(environ: Mapping[str, str] | None = None) -> int:
    """The resident-context cap: `TACONITE_CTX_CACHE` if it is a usize >= 1, else 16.

    Follows the Rust reader of taconite-adaface (`parse::<usize>()`: an optional leading
    `+`, digits only), not the older C `strtol` one.
    """
    env = os.environ if environ is None else environ
    raw = env.get("TACONITE_CTX_CACHE")
    if raw is None or not re.fullmatch(r"\+?[0-9]+", raw):
        return DEFAULT_CTX_CACHE
    value = int(raw)
    return value if value >= 1 else DEFAULT_CTX_CACHE


def timing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """`TACONITE_TIMING` turns instrumentation on by its presence, even when empty."""
    env = os.environ if environ is None else environ
    return "TACONITE_TIMING" in env


def context_key(xclbin: Path | str, kernel_name: str) -> str:
    """The sharing key of a hardware context: xclbin path + "\\n" + kernel name."""
    return f"{xclbin}\n{kernel_name}"


@dataclass(frozen=True)
class KernelSpec:
    """What a device needs to load one bundle kernel.

    kind: the kernel family the simulator executes ("gemm", "mha", ...): the record's
    `kind=` field if present, else its tag. xclbin/kernel_name name the hardware context;
    insts is the raw little-endian u32 instruction stream; fields are the record's `k=v`
    fields (the simulator reads shapes from them); source names the manifest line.
    """

    key: str
    kind: str
    xclbin: Path
    kernel_name: str
    insts: bytes
    fields: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    owner: str = ""

    @property
    def context_key(self) -> str:
        return context_key(self.xclbin, self.kernel_name)

    def where(self) -> str:
        return self.source or f"kernel {self.key}"

    def get_int(self, name: str, default: int | None = None) -> int:
        """The record field `name` as an unsigned int; DeviceError names the record if bad."""
        raw = self.fields.get(name)
        if raw is None:
            if default is None:
                raise DeviceError(f"{self.where()}: `{name}=` missing")
            return default
        if not re.fullmatch(r"\+?[0-9]+", raw):
            raise DeviceError(f"{self.where()}: `{name}={raw}` is malformed")
        return int(raw)

    def get_flag(self, name: str, default: bool = False) -> bool:
        raw = self.fields.get(name)
        if raw is None:
            return default
        if raw not in ("0", "1"):
            raise DeviceError(f"{self.where()}: `{name}={raw}` is not 0 or 1")
        return raw == "1"

    def get_str(self, name: str, default: str | None = None) -> str:
        raw = self.fields.get(name, default)
        if raw is None:
            raise DeviceError(f"{self.where()}: `{name}=` missing")
        return raw


def kernel_key(record: Any) -> str:
    """A kernel record's key: its first field unless that is a `k=v` field, else its tag."""
    if record.fields and "=" not in record.fields[0]:
        return record.fields[0]
    return record.tag


def kernel_spec(bundle: Any, record: Any, owner: str = "") -> KernelSpec:
    """The KernelSpec of a manifest record (npu.bundle.Record) of `bundle` (npu.bundle.Bundle).

    The context comes from `ctx=<xclbin key>` (an `xclbin` record) or from `xclbin=<path>`
    with `name=<kernel>` (default MLIR_AIE); the instruction stream from `insts=<path>`.
    Paths stay inside the bundle directory (the bundle refuses escapes with a BundleError).
    """
    where = f"manifest.txt:{record.line}"
    key = kernel_key(record)
    if record.has("ctx"):
        xclbin_rec = bundle.xclbin(record.value("ctx"))
        xclbin, kernel_name = xclbin_rec.path, xclbin_rec.kernel
    elif record.has("xclbin"):
        xclbin = record.path("xclbin")
        kernel_name = record.value("name") if record.has("name") else "MLIR_AIE"
    else:
        raise record.error(f"kernel record {key} has neither `ctx=` nor `xclbin=`")
    insts_path = record.path("insts")
    try:
        insts = insts_path.read_bytes()
    except OSError as exc:
        raise DeviceError(f"{insts_path}: {exc.strerror or exc}") from None
    if len(insts) % 4 or not insts:
        raise DeviceError(f"{insts_path}: not whole u32 words ({len(insts)} bytes)")
    return KernelSpec(
        key=key,
        kind=record.kv.get("kind", record.tag),
        xclbin=xclbin,
        kernel_name=kernel_name,
        insts=insts,
        fields=dict(record.kv),
        source=where,
        owner=owner,
    )


_buffer_ids = itertools.count(1)


def next_buffer_id() -> int:
    """A fresh buffer id: monotonic per process, so a reused address never matches a run."""
    return next(_buffer_ids)


class Buffer:
    """A device data buffer (or a sub-buffer of a root) with its host mapping.

    host: uint8 [nbytes], the root's mapping at this buffer's offset. Devices subclass it to
    attach their handle; `root` is the buffer that owns the allocation.
    """

    def __init__(self, host: np.ndarray, root: Buffer | None = None, offset: int = 0) -> None:
        self.id = next_buffer_id()
        self.host = host
        self.nbytes = int(host.nbytes)
        self.root = self if root is None else root
        self.offset = offset
        self.freed = False
        self.subs: list[Buffer] = []

    def array(self, dtype: Any, shape: Sequence[int] | None = None) -> np.ndarray:
        """A typed view of the host mapping (bytes past the last whole element are dropped)."""
        dt = np.dtype(dtype)
        a = self.host[: self.nbytes - self.nbytes % dt.itemsize].view(dt)
        return a if shape is None else a[: int(np.prod(shape))].reshape(shape)

    def write(self, data: np.ndarray, offset: int = 0) -> None:
        """Copy `data`'s bytes into the host mapping at `offset` (one wide copy)."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if offset < 0 or offset + raw.nbytes > self.nbytes:
            raise DeviceError(
                f"write of {raw.nbytes} bytes at {offset} outside a buffer of {self.nbytes} bytes"
            )
        np.copyto(self.host[offset : offset + raw.nbytes], raw)

    def check_live(self) -> None:
        if self.freed or self.root.freed:
            raise DeviceError(f"buffer {self.id} was freed")


def check_sub_range(parent_nbytes: int, offset: int, nbytes: int) -> None:
    """The shim's bound check for a sub-buffer [offset, +nbytes) of a parent."""
    if offset < 0 or nbytes < 0 or offset + nbytes > parent_nbytes:
        raise DeviceError(
            f"sub-buffer [{offset}, +{nbytes}) outside a buffer of {parent_nbytes} bytes"
        )


def check_insts_words(nbytes: int, words: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validate instruction-word patches: `(i+1)*4 <= bytes`, values fit u32."""
    out = []
    for i, v in words:
        if i < 0 or (i + 1) * 4 > nbytes:
            raise DeviceError(f"instruction word {i} is past the stream")
        if not 0 <= v < 2**32:
            raise DeviceError(f"instruction word {i}: value {v} does not fit 32 bits")
        out.append((int(i), int(v)))
    return out


EWMA_ALPHA = 0.25


@dataclass
class KernelTiming:
    """Per-kernel-key dispatch counters (host wall time); kernels loaded twice share them.

    expected_s: the measured time of one dispatch, an EWMA (EWMA_ALPHA) of `samples`
    completions, each from when the device could start it (its start, or the completion of
    the dispatch before it) to when its wait saw it done. A completion already done at the
    wait's first poll only bounds the time from above, so it is taken only when it lowers
    the estimate (a late wake-up must not teach a longer time, which would pace the next
    wait later still)."""

    runs: int = 0
    run_s: float = 0.0
    wait_s: float = 0.0
    expected_s: float | None = None
    samples: int = 0

    def learn(self, seconds: float, exact: bool) -> None:
        if self.expected_s is None:
            self.expected_s = seconds
        elif exact or seconds < self.expected_s:
            self.expected_s += EWMA_ALPHA * (seconds - self.expected_s)
        else:
            return
        self.samples += 1


@dataclass
class DeviceStats:
    """Counters of the TACONITE_TIMING line: loads = context creations, hits = LRU hits,
    evict = evictions; load_s = time creating contexts, run_s = host wall time of the
    dispatches, wait_s = launch + wait time. Wall-clock seconds, on any backend."""

    loads: int = 0
    hits: int = 0
    evict: int = 0
    runs: int = 0
    load_s: float = 0.0
    run_s: float = 0.0
    wait_s: float = 0.0
    timeouts: int = 0  # dispatches that passed their deadline
    kernels: dict[str, KernelTiming] = field(default_factory=dict)

    def line(self, backend: str) -> str:
        return (
            f"[{backend}] loads={self.loads} hits={self.hits} evict={self.evict} runs={self.runs}"
            f"  load={self.load_s:.3f}s run={self.run_s:.3f}s (wait={self.wait_s:.3f}s)"
        )


def context_full(exc: BaseException) -> bool:
    """Whether a context-creation failure means "no free slot": evict one more and retry."""
    return isinstance(exc, RuntimeError) or "CREATE_HWCTX" in str(exc)


@dataclass
class ModelContexts:
    """One model's share of the device's context budget, as the device saw it.

    resident: its context keys resident now (least recently used first); loads: contexts it
    created; load_s: their creation cost (seconds: wall clock on XRT, modelled on the sim);
    evicted: its contexts evicted to make room, by the model that needed the room ("" for a
    load with no owner); waits / wait_s: waits for slots other processes held.
    """

    resident: tuple[str, ...] = ()
    loads: int = 0
    load_s: float = 0.0
    evicted: dict[str, int] = field(default_factory=dict)
    waits: int = 0
    wait_s: float = 0.0

    @property
    def load_cost_s(self) -> float | None:
        """Measured seconds per context load, None before the first load."""
        return self.load_s / self.loads if self.loads else None


class ContextCache:
    """An LRU of resident hardware contexts keyed by context key, capped at `cap`, each
    counted against the model (owner) that loaded it.

    A hit moves the entry to the most-recent end. A miss evicts from the least-recent end
    while the cache is at the cap, then creates; when creation fails with "no free slot"
    (context_full), it evicts one more and retries while anything of this process is
    resident (taconite-adaface's policy; taconite-sapiens2 gives up its least recently used
    other context the same way). With nothing left to give up, the slots belong to other
    processes: it waits `waits` x `wait_s` for one to free (taconite-sapiens2's WAITS), then
    fails with `load(<key>): ...` naming the holders when `holders()` knows them.
    cost(wall seconds) -> the seconds a creation is counted as (the sim: its modelled time).
    """

    def __init__(
        self,
        cap: int,
        create: Callable[[str], Any],
        release: Callable[[str, Any], None],
        stats: DeviceStats,
        *,
        holders: Callable[[], str] | None = None,
        cost: Callable[[float], float] | None = None,
        waits: int = CONTEXT_WAITS,
        wait_s: float = CONTEXT_WAIT_S,
    ) -> None:
        self.cap = cap
        self._create = create
        self._release = release
        self._stats = stats
        self._holders = holders
        self._cost = cost or (lambda wall: wall)
        self.waits, self.wait_s = waits, wait_s
        self._lru: OrderedDict[str, Any] = OrderedDict()
        self._owner: dict[str, str] = {}
        self.models: dict[str, ModelContexts] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._lru

    def keys(self) -> list[str]:
        """Resident keys, least recently used first."""
        return list(self._lru)

    def _model(self, owner: str) -> ModelContexts:
        return self.models.setdefault(owner, ModelContexts())

    def view(self) -> dict[str, ModelContexts]:
        """Every model's ModelContexts, with `resident` filled in now."""
        for owner, m in self.models.items():
            m.resident = tuple(k for k in self._lru if self._owner.get(k) == owner)
        return dict(self.models)

    def acquire(self, key: str, owner: str = "") -> Any:
        if key in self._lru:
            self._lru.move_to_end(key)
            self._stats.hits += 1
            return self._lru[key]
        while len(self._lru) >= self.cap:
            self.evict_lru(owner)
        model = self._model(owner)
        t0 = time.perf_counter()
        waited = 0
        while True:
            try:
                ctx = self._create(key)
                break
            except Exception as exc:
                name = key.replace(chr(10), " ")
                if not context_full(exc):
                    raise DeviceError(f"load({name}): {exc}") from exc
                if self._lru:
                    self.evict_lru(owner)
                    continue
                if waited >= self.waits:
                    raise DeviceError(
                        f"load({name}): {exc}: every NPU hardware context is taken by other "
                        f"models or programs (NPU2 has 16; {self._holders_text()}); free some "
                        "and try again"
                    ) from exc
                waited += 1
                model.waits += 1
                model.wait_s += self.wait_s
                time.sleep(self.wait_s)
        wall = time.perf_counter() - t0 - waited * self.wait_s
        self._stats.loads += 1
        self._stats.load_s += wall
        model.loads += 1
        model.load_s += self._cost(wall)
        self._lru[key] = ctx
        self._owner[key] = owner
        return ctx

    def _holders_text(self) -> str:
        held = self._holders() if self._holders is not None else ""
        return held or "which programs hold them is unknown"

    def evict_lru(self, by: str = "") -> None:
        key, ctx = self._lru.popitem(last=False)
        victim = self._model(self._owner.pop(key, ""))
        victim.evicted[by] = victim.evicted.get(by, 0) + 1
        self._stats.evict += 1
        self._release(key, ctx)

    def take(self, key: str) -> Any:
        """Remove a context without releasing it (it is being parked); None if not resident."""
        return self._lru.pop(key, None)

    def drop(self, key: str) -> None:
        """Free a context whose last kernel was freed (not counted as an eviction)."""
        ctx = self._lru.pop(key, None)
        self._owner.pop(key, None)
        if ctx is not None:
            self._release(key, ctx)

    def clear(self) -> None:
        for key in list(self._lru):
            self.drop(key)


class Kernel(Protocol):
    """A loaded kernel: its spec, and patches that survive context reloads."""

    spec: KernelSpec

    def set_insts_words(self, words: Iterable[tuple[int, int]]) -> None:
        """Overwrite 32-bit instruction words [(index, value)]; they last for later runs."""
        ...


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


# stepped computations a device thread keeps in flight (stages.infer.DeviceThread), and so the
# buffer slots a stepped model allocates (npu.models.sapiens2.npu.Sapiens2Replay): with two,
# the device has only the other computation's one queued step to run while the host works on
# a long step (a Sapiens2 head's InstanceNorms), and idles once that is done; with three it
# has the steps of two (docs/inference.md, "Sapiens2: host glue overlapped with the device")
INTERLEAVE = 3


class Interleaved:
    """Stepped device computations (Steps) in flight together on one thread, as taconite's
    device is kept busy by queueing the next dispatch before waiting for the current one:
    add() runs a computation's host work up to its first device step; step() waits for the
    oldest outstanding step (the others' launches stay queued on the device meanwhile) and
    resumes its computation, whose host work up to its next step then runs while the
    device works through the other computations' launches. A computation's end or error
    goes to its `done(result, error)`.

    Computations in step with each other do their long host steps at the same time (a
    Sapiens2 head's InstanceNorms), when the device has only the others' short dispatches
    to run; admits() staggers them: with n in flight at most, another computation should
    join only once those in flight are 1/n of the way through (the newest; the others are
    further), by the device time the last computation of their kind took."""

    def __init__(self) -> None:
        self._active: deque[list[Any]] = deque()  # [steps, launches, done, kind, busy_s]
        self._length: dict[str, float] = {}  # kind -> device seconds of its last computation

    def __len__(self) -> int:
        return len(self._active)

    def admits(self, share: float = 0.5) -> bool:
        """Whether a computation joining now would be out of step with those in flight: each
        is at least `share` of the way through."""
        return all(entry[4] >= share * self._length.get(entry[3], 0) for entry in self._active)

    def add(
        self, steps: Steps, done: Callable[[Any, BaseException | None], None], kind: str = ""
    ) -> None:
        self._advance([steps, (), done, kind, 0.0], first=True)

    def step(self) -> None:
        """Resume one computation: the oldest whose device step has finished, else the
        oldest doing host work (a step of no launches: a piece of a long host step), so
        the device is fed first; else wait for the oldest outstanding step."""
        ready = next((e for e in self._active if all(x.finished() for x in e[1])), None)
        entry = ready or self._active[0]
        self._active.remove(entry)
        try:
            wait_all(entry[1])
        except BaseException as exc:
            entry[0].close()
            entry[2](None, exc)
            return
        self._advance(entry, first=False)

    def _advance(self, entry: list[Any], first: bool) -> None:
        steps, finished, done, kind, busy = entry
        busy += sum(launch.busy_s for launch in finished)
        try:
            launches = next(steps) if first else steps.send(None)
        except StopIteration as stop:
            self._length[kind] = busy
            done(stop.value, None)
        except BaseException as exc:
            done(None, exc)
        else:
            entry[1], entry[4] = launches, busy
            self._active.append(entry)


class Device(Protocol):
    """What DeviceOps and model runtimes need from a device (XrtDevice or SimDevice).

    backend: "npu" for hardware, "sim" for the simulator. One thread at a time.
    """

    backend: str
    stats: DeviceStats

    def load(self, spec: KernelSpec) -> Kernel:
        """Load a kernel: share or create its context (LRU), upload its instructions."""
        ...

    def free_kernel(self, kernel: Kernel) -> None: ...

    def alloc(self, nbytes: int) -> Buffer:
        """A zeroed host-mapped data buffer of nbytes."""
        ...

    def sub(self, buf: Buffer, offset: int, nbytes: int) -> Buffer:
        """A sub-buffer [offset, +nbytes) of buf, always cut from buf's root."""
        ...

    def free(self, buf: Buffer) -> None:
        """Free a buffer (and its sub-buffers); drops every cached run that uses it."""
        ...

    def to_device(self, buf: Buffer) -> None: ...

    def from_device(self, buf: Buffer) -> None: ...

    def start(self, kernel: Kernel, buffers: Sequence[Buffer]) -> Launch:
        """Queue a run and return at once; runs execute in submission order."""
        ...

    def run(self, kernel: Kernel, buffers: Sequence[Buffer]) -> float:
        """start + wait: the wall seconds of the dispatch."""
        ...

    def run_all(
        self, dispatches: Iterable[tuple[Kernel, Sequence[Buffer]]], depth: int = 2
    ) -> float:
        """Run independent dispatches with up to `depth` in flight; wall seconds."""
        ...

    def resident_contexts(self) -> list[str]:
        """Context keys resident now, least recently used first."""
        ...

    def context_view(self) -> dict[str, ModelContexts]:
        """Each model's (kernel owner's) share of the context budget."""
        ...

    def close(self) -> None: ...


def check_insts_stream(spec: KernelSpec) -> None:
    """A device loads only a non-empty stream of whole u32 words; DeviceError names the spec."""
    if len(spec.insts) % 4 or not spec.insts:
        raise DeviceError(f"{spec.where()}: the instruction stream is not whole u32 words")


def patched_insts(insts: bytes, patches: Mapping[int, int]) -> np.ndarray:
    """The instruction stream as uint32 words with the patches {index: value} applied."""
    words = np.frombuffer(insts, np.uint32).copy()
    for i, v in patches.items():
        words[i] = v
    return words


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


DEVICE_BACKENDS = ("sim", "npu")


def open_device(backend: str, **sim_options: Any) -> Device | None:
    """The device a backend runs on: None for cpu (numpy needs none); the process's one XRT
    device for npu (npu.xrt; a DeviceError names what is missing); a new simulated NPU for
    sim, built with `sim_options` (npu.sim.SimDevice's keywords: cost, sleep, registry_dir,
    hwctx_limit, faults). A device passed where a backend name is expected is returned as is."""
    if not isinstance(backend, str):
        return backend
    if backend == "cpu":
        return None
    if backend == "npu":
        if sim_options:
            raise DeviceError(f"backend npu: sim options given: {', '.join(sim_options)}")
        from npu.xrt import xrt_device

        return xrt_device()
    if backend == "sim":
        from npu.sim import SimDevice

        return SimDevice(**sim_options)
    raise DeviceError(f"backend {backend!r}: expected cpu, {' or '.join(DEVICE_BACKENDS)}")
