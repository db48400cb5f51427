"""The device protocol both NPU devices implement (XRT over pyxrt, and the simulator).

A device loads bundle kernels, allocates host-mapped buffers (and sub-buffers cut from a
root), patches instruction words and runs a kernel over an argument tuple. Kernels that
share an (xclbin, kernel name) share one hardware context, and resident contexts live in an
LRU capped at 16 (`TACONITE_CTX_CACHE`) with evict-and-retry when creation fails, as
taconite's shim and taconite-adaface do, then a bounded wait for slots other processes hold,
as taconite-sapiens2 does; each context is counted against the model that loaded it
(docs/device.md). `DeviceCore` holds the
bookkeeping both devices share (which kernels use which context, buffers, counters, teardown);
each device adds only what its backend does with a context, a kernel, a buffer and a run.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from pipeline.errors import NpucamError

DEFAULT_CTX_CACHE = 16
# taconite-sapiens2 npu.rs `WAITS` (50 at 465946c; 200 at 1e2c515): 100 ms waits for a slot
# other processes hold, once this process has no context of its own left to give up.
CONTEXT_WAITS = 50
CONTEXT_WAIT_S = 0.1
# ert_cmd_state values of XRT's ert.h; the simulator reports the same numbers.
ERT_CMD_STATE_COMPLETED = 4
ERT_CMD_STATE_ERROR = 5
ERT_CMD_STATE_TIMEOUT = 8


class DeviceError(NpucamError):
    """A device could not be opened, a kernel could not be loaded or a run failed."""


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


@dataclass
class KernelTiming:
    """Per-kernel-key dispatch counters (host wall time); kernels loaded twice share them."""

    runs: int = 0
    run_s: float = 0.0
    wait_s: float = 0.0


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
    """A started run; wait() blocks, checks the final state and returns wall seconds."""

    def wait(self) -> float: ...


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

    def start(self, kernel: Kernel, buffers: Sequence[Buffer]) -> Launch: ...

    def run(self, kernel: Kernel, buffers: Sequence[Buffer]) -> float:
        """start + wait: the wall seconds of the dispatch."""
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
    pending: Any  # launches in flight: a count or a list; falsy when none
    freed: bool


K = TypeVar("K", bound=LoadedKernel)
B = TypeVar("B", bound=Buffer)


class DeviceCore(Generic[K, B]):
    """The bookkeeping XrtDevice and SimDevice share, behind one internal lock.

    Kernels are listed by context key (`_users`); a context's last kernel freed frees the
    context, and a context evicted from the ContextCache unloads its kernels' device objects
    (they come back on the next run, patches re-applied). Buffers are tracked by id until
    freed. A subclass supplies the backend's part through the hooks below; its kernels carry
    `spec`, `patches`, `timing`, `pending` and `freed`.
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
        self._buffers: dict[int, B] = {}
        self.closed = False

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
        """Drop the kernel's device objects (its context is going, or it is freed)."""
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
        """Start a run of kernel over the argument buffers."""
        raise NotImplementedError

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
        for kernel in self._users.get(key, []):
            self._unload(kernel)
        self._destroy_context(key, ctx)

    def load(self, spec: KernelSpec) -> K:
        """Load a kernel: share or create its context (LRU), upload its instructions."""
        with self._lock:
            self._check_open()
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

    def run(self, kernel: K, buffers: Sequence[Buffer]) -> float:
        """start + wait: the wall seconds of the dispatch."""
        return self.start(kernel, buffers).wait()

    def _check_open(self) -> None:
        if self.closed:
            raise DeviceError(f"the {self.label} device is closed")

    def close(self) -> None:
        """Free every kernel, buffer and context; print the TACONITE_TIMING line(s) if on."""
        with self._lock:
            if self.closed:
                return
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
