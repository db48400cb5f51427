"""A simulated NPU: the XRT device's interface, executing bundle kernels in numpy.

Since an xclbin cannot be executed, the simulator reads what a kernel computes from its
manifest record (kind, shapes, tiling, epilogue: docs/device.md) and runs that in numpy
with the NPU's number formats (bf16 operands, bfp16ebs8 GEMM weights, bf16 results), at
start, after checking that it is ordered after what it shares bytes with on other hardware
contexts (the driver orders runs only within one: docs/device.md, "Ordering"). It
models device time (per dispatch from FLOPs and bytes, context creation and switches) and
the machine-wide 16-context limit through a lock-file registry every process shares.
Simulated times are labelled "sim" and are never hardware measurements. The kernel kinds are
npu/sim_kernels.py (and sim_clip, sim_conv); bundles for the simulator, npu/sim_bundle.py.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import math
import os
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import npu.sim_clip  # noqa: F401  (registers clip_mha, addln)
import npu.sim_conv  # noqa: F401  (registers adaface_conv)
from npu.device import (
    CONTEXT_WAIT_S,
    CONTEXT_WAITS,
    ERT_CMD_STATE_COMPLETED,
    ERT_CMD_STATE_ERROR,
    ERT_CMD_STATE_RUNNING,
    ERT_CMD_STATE_SUBMITTED,
    ERT_CMD_STATE_TIMEOUT,
    Buffer,
    DeviceCore,
    DeviceError,
    DeviceLaunch,
    KernelSpec,
    KernelTiming,
    Parked,
    check_insts_stream,
    patched_insts,
)
from npu.sim_kernels import SIM_KERNELS, SimKernelModel

HWCTX_LIMIT = 16  # NPU2's per-device hardware-context limit, shared by every process
REGISTRY_ENV = "NPUCAM_SIM_HWCTX_DIR"


@dataclass(frozen=True)
class CostModel:
    """Simulated device time. A dispatch costs
    `dispatch_s + max(flops / flops_per_s[kind], bytes / bytes_per_s)` (a roofline);
    creating a context costs `ctx_create_s`; a dispatch whose context differs from the
    previous dispatch's costs `ctx_switch_s` more (the incoming design reconfigures tiles).

    Defaults are effective NPU2 rates derived from upstream's published timings, not peaks:
    GEMM 1.6 TFLOP/s (CLIP's vision fc1, 443 GFLOP in 0.27 s on a Ryzen AI 9 HX 370), MHA
    1.2 TFLOP/s (Sapiens2-0.4b's 24 x 16-head 3081-token attention in ~0.8 s), 60 GB/s of
    DRAM bandwidth, 2.9 ms per switch (the shim's 8-column GEMM figure). ctx_create_s (30 ms)
    and dispatch_s (50 us) are assumptions: no upstream number exists.
    """

    flops_per_s: tuple[tuple[str, float], ...] = (("gemm", 1.6e12), ("mha", 1.2e12))
    default_flops_per_s: float = 1.0e12
    bytes_per_s: float = 60e9
    dispatch_s: float = 50e-6
    ctx_create_s: float = 30e-3
    ctx_switch_s: float = 2.9e-3

    def rate(self, kind: str) -> float:
        return dict(self.flops_per_s).get(kind, self.default_flops_per_s)

    def dispatch(self, kind: str, flops: int, nbytes: int) -> float:
        """Simulated seconds of one dispatch (no context switch)."""
        return self.dispatch_s + max(flops / self.rate(kind), nbytes / self.bytes_per_s)


# The cost of a stand-in's own dispatches inside SimDevice.paced: none (the pass is charged).
FREE = CostModel((), math.inf, math.inf, 0.0, 0.0, 0.0)


@dataclass
class SimFaults:
    """Fault injection. error_kernels: kernel keys whose runs end in ERT_CMD_STATE_ERROR;
    hang_kernels: keys whose runs hang; hang_next: the next n dispatches (any kernel) hang;
    context_failures: the next n context creations fail as CREATE_HWCTX does. A hung run
    stays RUNNING (and so does every run queued behind it on its context) until watchdog_s
    wall seconds after its start, the driver's job timeout (amdxdna's HWCTX_MAX_TIMEOUT,
    60 s), when it ends in ERT_CMD_STATE_TIMEOUT; the wait's deadline normally gives up on
    it first (docs/inference.md)."""

    error_kernels: set[str] = field(default_factory=set)
    hang_kernels: set[str] = field(default_factory=set)
    hang_next: int = 0
    context_failures: int = 0
    watchdog_s: float = 60.0


@dataclass
class SimKernelTime:
    """Per-kernel simulated counters (sim seconds, not hardware measurements)."""

    dispatches: int = 0
    device_s: float = 0.0
    flops: int = 0
    bytes: int = 0


@dataclass
class SimTime:
    """Simulated device time ("sim"): device_time_s = dispatches + creations + switches +
    paced passes (SimDevice.paced: the modelled time of the real model a stand-in replaces)."""

    device_time_s: float = 0.0
    dispatch_s: float = 0.0
    ctx_create_s: float = 0.0
    ctx_switch_s: float = 0.0
    creations: int = 0
    switches: int = 0
    paced_s: float = 0.0
    paced_passes: int = 0
    kernels: dict[str, SimKernelTime] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"[sim] device_time={self.device_time_s:.6f}s (simulated: dispatch="
            f"{self.dispatch_s:.6f}s create={self.ctx_create_s:.6f}s x{self.creations}"
            f" switch={self.ctx_switch_s:.6f}s x{self.switches}"
            f" paced={self.paced_s:.6f}s x{self.paced_passes})"
        )


# -- the machine-wide context registry -------------------------------------------------


def default_registry_dir() -> Path:
    """`$NPUCAM_SIM_HWCTX_DIR`, else <tmp>/npucam-sim-hwctx-<uid>: one per user and machine."""
    env = os.environ.get(REGISTRY_ENV)
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"npucam-sim-hwctx-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ContextRegistry:
    """The simulated driver's hwctx table: one file `<pid>-<n>.ctx` per held context in a
    directory every process shares, guarded by flock on `.lock`; files of dead PIDs are
    pruned (os.kill(pid, 0)) before counting against the limit."""

    _serial = itertools.count(1)

    def __init__(self, directory: Path, limit: int = HWCTX_LIMIT) -> None:
        self.dir = Path(directory)
        self.limit = limit
        self.dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self):
        with (self.dir / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _prune(self) -> list[Path]:
        held = []
        for p in self.dir.glob("*.ctx"):
            try:
                pid = int(p.name.split("-", 1)[0])
            except ValueError:
                continue
            if _alive(pid):
                held.append(p)
            else:
                p.unlink(missing_ok=True)
        return held

    def held(self) -> list[tuple[int, str]]:
        """(pid, context label) of every live context on the machine."""
        with self._locked():
            out = []
            for p in self._prune():
                with contextlib.suppress(OSError):
                    out.append((int(p.name.split("-", 1)[0]), p.read_text()))
            return out

    def acquire(self, label: str) -> Path:
        """Take a slot, or raise RuntimeError as the driver's CREATE_HWCTX ioctl fails."""
        with self._locked():
            held = self._prune()
            if len(held) >= self.limit:
                raise RuntimeError(
                    f"DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-16): Device or resource "
                    f"busy (sim: {len(held)} of {self.limit} contexts held machine-wide)"
                )
            slot = self.dir / f"{os.getpid()}-{next(self._serial)}-{id(self):x}.ctx"
            slot.write_text(label)
            return slot

    def release(self, slot: Path) -> None:
        with self._locked():
            slot.unlink(missing_ok=True)


# -- the device --------------------------------------------------------------------------


def _release_slots(registry: ContextRegistry, slots: set[Path]) -> None:
    for slot in list(slots):
        registry.release(slot)
    slots.clear()


class SimBuffer(Buffer):
    """A host buffer standing in for a host_only BO; `version` counts syncs to the device."""

    def __init__(self, host: np.ndarray, root: Buffer | None = None, offset: int = 0) -> None:
        super().__init__(host, root, offset)
        self.version = 0


@dataclass
class SimKernel:
    """A loaded simulated kernel; `words` (the patched stream) exists while it is resident."""

    device: SimDevice
    spec: KernelSpec
    model: SimKernelModel
    patches: dict[int, int] = field(default_factory=dict)
    timing: KernelTiming = field(default_factory=KernelTiming)
    words: np.ndarray | None = None
    pending: list[DeviceLaunch] = field(default_factory=list)
    freed: bool = False

    def set_insts_words(self, words: Iterable[tuple[int, int]]) -> None:
        self.device.set_insts_words(self, words)


Access = tuple[Buffer, int, int, bool]  # (root buffer, first byte, end byte, written)


def footprint(model: SimKernelModel, buffers: Sequence[Buffer]) -> list[Access]:
    """The bytes of their roots a dispatch's arguments cover, and which it writes."""
    return [
        (b.root, b.offset, b.offset + b.nbytes, i in model.writes) for i, b in enumerate(buffers)
    ]


class SimLaunch(DeviceLaunch):
    """A simulated run, computed at start. Its state (what run.state() would read) is
    SUBMITTED, then RUNNING until ready_at (the modelled end; at once without sleep), then
    `final`; a hung one stays RUNNING until the watchdog, then TIMEOUT."""

    def __init__(
        self,
        device: SimDevice,
        kernel: SimKernel,
        buffers: Sequence[Buffer],
        t0: float,
        final: int,
        hung: bool,
        ready_at: float,
        accesses: list[Access],
    ) -> None:
        super().__init__(device, kernel, buffers, t0)
        self.final, self.hung, self.ready_at = final, hung, ready_at
        self.footprint = accesses  # what it reads and writes (footprint())


class SimDevice(DeviceCore[SimKernel, SimBuffer]):
    """The simulated NPU (backend "sim"). Same interface as npu.xrt.XrtDevice.

    cost: the CostModel; sleep: runs take the modelled time in wall time (the device
    serialises dispatches, so a wait sees a run finish when a real NPU would; without it
    every run is done at once); registry_dir / hwctx_limit: the
    machine-wide context table (default $NPUCAM_SIM_HWCTX_DIR or a per-user temp dir, 16);
    faults: SimFaults for reliability tests; context_waits / context_wait_s: the bounded wait
    for slots other processes hold (taconite-sapiens2's 50 x 100 ms by default).
    """

    backend = "sim"
    label = "sim"

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        sleep: bool = False,
        registry_dir: Path | str | None = None,
        hwctx_limit: int = HWCTX_LIMIT,
        faults: SimFaults | None = None,
        context_waits: int = CONTEXT_WAITS,
        context_wait_s: float = CONTEXT_WAIT_S,
    ) -> None:
        self.cost = cost or CostModel()
        self.sleep = sleep
        self.faults = faults or SimFaults()
        self.registry = ContextRegistry(
            Path(registry_dir) if registry_dir is not None else default_registry_dir(), hwctx_limit
        )
        super().__init__()
        self.set_context_wait(context_waits, context_wait_s)
        self.sim = SimTime()
        self._last_context: str | None = None
        self._busy_until = 0.0
        self._hung_runs: dict[str, SimLaunch] = {}  # context key -> its hung run in flight
        # a device dropped without close() still gives its machine-wide slots back
        self._slots: set[Path] = set()
        self._release_slots = weakref.finalize(self, _release_slots, self.registry, self._slots)
        if self._timing:
            atexit.register(self.close)  # print the timing lines even if never closed

    # contexts and kernels

    def _create_context(self, key: str) -> Path:
        if self.faults.context_failures > 0:
            self.faults.context_failures -= 1
            raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (sim fault)")
        slot = self.registry.acquire(key.replace("\n", " "))
        self._slots.add(slot)
        self.sim.creations += 1
        self.sim.ctx_create_s += self.cost.ctx_create_s
        self.sim.device_time_s += self.cost.ctx_create_s
        return slot

    def _context_cost(self, wall: float) -> float:
        return self.cost.ctx_create_s

    def _context_holders(self) -> str:
        """The registry's live slots by pid: `held by pid <p> (<n> contexts: <xclbin>, ...)`."""
        by_pid: dict[int, list[str]] = {}
        for pid, label in self.registry.held():
            by_pid.setdefault(pid, []).append(Path(label.rsplit(" ", 1)[0]).name)
        return "; ".join(
            f"held by pid {pid}{' (this process)' if pid == os.getpid() else ''} "
            f"({len(names)} contexts: {', '.join(sorted(names))})"
            for pid, names in sorted(by_pid.items())
        )

    def _destroy_context(self, key: str, slot: Path) -> None:
        if self._last_context == key:
            self._last_context = None
        self._slots.discard(slot)
        self.registry.release(slot)

    def _unload(self, kernel: SimKernel) -> None:
        kernel.words = None

    def _resident(self, kernel: SimKernel) -> None:
        self._contexts.acquire(kernel.spec.context_key, kernel.spec.owner)
        if kernel.words is None:
            kernel.words = patched_insts(kernel.spec.insts, kernel.patches)

    def _new_kernel(self, spec: KernelSpec) -> SimKernel:
        factory = SIM_KERNELS.get(spec.kind)
        if factory is None:
            raise DeviceError(
                f"{spec.where()}: the simulator has no kernel kind {spec.kind!r}"
                f" (it knows {', '.join(sorted(SIM_KERNELS))})"
            )
        check_insts_stream(spec)
        if not spec.xclbin.is_file():
            raise DeviceError(f"{spec.where()}: xclbin {spec.xclbin} is missing")
        kernel = SimKernel(self, spec, factory(spec))
        self.sim.kernels.setdefault(spec.key, SimKernelTime())
        return kernel

    def _patch(self, kernel: SimKernel, words: list[tuple[int, int]]) -> None:
        if kernel.words is not None:
            for i, v in words:
                kernel.words[i] = v

    # buffers

    def _new_buffer(self, nbytes: int) -> SimBuffer:
        return SimBuffer(np.zeros(nbytes, np.uint8))

    def _new_sub(self, root: Buffer, offset: int, nbytes: int) -> SimBuffer:
        return SimBuffer(root.host[offset : offset + nbytes], root, offset)

    def _drop_buffers(self, gone: list[Buffer]) -> None:
        for b in gone:
            b.freed = True
            self._buffers.pop(b.id, None)

    def to_device(self, buf: Buffer) -> None:
        buf.check_live()
        with self._lock:
            self._check_sync(buf, to_device=True)
        buf.root.version += 1  # type: ignore[attr-defined]

    def from_device(self, buf: Buffer) -> None:
        buf.check_live()
        with self._lock:
            self._check_sync(buf, to_device=False)

    # ordering, as the driver orders runs (docs/device.md, "Ordering")

    def _unretired(self, but: str | None = None) -> Iterator[SimLaunch]:
        """Launches not yet seen finished (waited for, or retired by finished()), on every
        context but `but` (none to look for when nothing is in flight: the common case)."""
        if not self._in_flight:
            return
        for key, kernels in self._users.items():
            if key != but:
                for kernel in kernels:
                    yield from kernel.pending  # type: ignore[misc]

    def _check_order(self, kernel: SimKernel, accesses: list[Access]) -> None:
        """DeviceError unless the dispatch is ordered after every unretired launch on another
        hardware context whose bytes it shares, one of the two writing them: the driver
        orders runs only within a context (a hazard the sim would otherwise hide by
        executing each dispatch at its start)."""
        for other in self._unretired(but=kernel.spec.context_key):
            for root, lo, hi, written in accesses:
                for o_root, o_lo, o_hi, o_written in other.footprint:
                    if root is o_root and lo < o_hi and o_lo < hi and (written or o_written):
                        raise DeviceError(
                            f"{kernel.spec.where()}: {kernel.spec.key} "
                            f"{'writes' if written else 'reads'} bytes [{max(lo, o_lo)}, "
                            f"{min(hi, o_hi)}) of buffer {root.id} that {other.kernel.spec.key}"
                            f" ({other.kernel.spec.where()}), started on another hardware "
                            f"context and not yet waited for, "
                            f"{'writes' if o_written else 'reads'}: the driver does not "
                            "order runs across contexts; wait for it first"
                        )

    def _check_sync(self, buf: Buffer, to_device: bool) -> None:
        """DeviceError for a sync of bytes an unretired launch writes (or, to the device,
        reads): the host would race the device."""
        lo, hi = buf.offset, buf.offset + buf.nbytes
        for other in self._unretired():
            for root, o_lo, o_hi, written in other.footprint:
                if root is buf.root and lo < o_hi and o_lo < hi and (written or to_device):
                    raise DeviceError(
                        f"a sync {'to' if to_device else 'from'} the device of bytes "
                        f"[{max(lo, o_lo)}, {min(hi, o_hi)}) of buffer {root.id} that "
                        f"{other.kernel.spec.key} ({other.kernel.spec.where()}), not yet "
                        f"waited for, {'writes' if written else 'reads'}"
                    )

    # runs

    def start(self, kernel: SimKernel, buffers: Sequence[Buffer]) -> SimLaunch:
        with self._lock:
            self._check_usable()
            self._reap()
            t0 = time.perf_counter()
            if kernel.freed:
                raise DeviceError(f"{kernel.spec.key}: kernel was freed")
            model = kernel.model
            if len(buffers) != len(model.arg_bytes):
                raise DeviceError(
                    f"{kernel.spec.key}: {kernel.spec.kind} takes {len(model.arg_bytes)} buffers,"
                    f" got {len(buffers)}"
                )
            for i, (b, need) in enumerate(zip(buffers, model.arg_bytes, strict=True)):
                b.check_live()
                if b.nbytes < need:
                    raise DeviceError(
                        f"{kernel.spec.key}: argument {i} is {b.nbytes} bytes,"
                        f" the kernel reads {need}"
                    )
            accesses = footprint(model, buffers)
            self._check_order(kernel, accesses)
            self._resident(kernel)
            assert kernel.words is not None
            key = kernel.spec.key
            ctx_key = kernel.spec.context_key
            nbytes = sum(b.nbytes for b in buffers) + len(kernel.spec.insts)
            dispatch = self.cost.dispatch(kernel.spec.kind, model.flops, nbytes)
            faults = self.faults
            behind = self._hung_runs.get(ctx_key)
            hung = behind is not None and self._state(behind) == ERT_CMD_STATE_RUNNING
            if not hung and (key in faults.hang_kernels or faults.hang_next > 0):
                faults.hang_next = max(0, faults.hang_next - 1)
                hung = True
            state = ERT_CMD_STATE_ERROR if key in faults.error_kernels else ERT_CMD_STATE_COMPLETED
            if not hung and state == ERT_CMD_STATE_COMPLETED:
                model.execute(buffers, kernel.words)
            switch = 0.0
            if self._last_context != ctx_key:
                switch = self.cost.ctx_switch_s
                self.sim.switches += 1
                self._last_context = ctx_key
            self.sim.ctx_switch_s += switch
            self.sim.dispatch_s += dispatch
            self.sim.device_time_s += switch + dispatch
            kt = self.sim.kernels[key]
            kt.dispatches += 1
            kt.device_s += dispatch
            kt.flops += model.flops
            kt.bytes += nbytes
            expected = switch + dispatch
            ready_at = t0
            if self.sleep and not hung:  # a hung run holds no place on the device clock
                ready_at = max(t0, self._busy_until) + expected
                self._busy_until = ready_at
            launch = SimLaunch(self, kernel, buffers, t0, state, hung, ready_at, accesses)
            if hung and behind is None:
                self._hung_runs[ctx_key] = launch
            begin = ready_at - expected if self.sleep and not hung else launch.t_start
            self._submitted(launch, expected, paced=self.sleep, begin=begin)
            return launch

    def _state(self, launch: SimLaunch) -> int:
        now = time.perf_counter()
        if launch.hung:
            if now - launch.t_start >= self.faults.watchdog_s:
                return ERT_CMD_STATE_TIMEOUT
            return ERT_CMD_STATE_RUNNING
        if now < launch.ready_at:
            return ERT_CMD_STATE_SUBMITTED if now < launch.begin else ERT_CMD_STATE_RUNNING
        return launch.final

    def _park(
        self, key: str, ctx: Path | None, kernels: list[SimKernel], launches: list[SimLaunch]
    ) -> list[object]:
        """The context's slot stays held (in the machine-wide registry too) until its hung
        runs end; nothing writes the buffers of a simulated hung run, so they stay."""
        for kernel in kernels:
            kernel.words = None
        self._hung_runs.pop(key, None)
        if self._last_context == key:
            self._last_context = None
        return [ctx]

    def _release_parked(self, parked: Parked) -> None:
        if parked.ctx is not None:
            self._slots.discard(parked.ctx)
            self.registry.release(parked.ctx)

    @contextlib.contextmanager
    def paced(self, seconds: float) -> Iterator[None]:
        """A pass that takes `seconds` of modelled device time (the real model's, which the
        dispatches made inside stand in for: they cost none). The device clock runs from the
        pass's start, or the end of the work before it; with `sleep` the block returns no
        earlier than that, sleeping without the GIL. A pass that raises is not charged."""
        with self._lock:
            start = max(time.perf_counter(), self._busy_until)
            saved, self.cost = self.cost, FREE
        try:
            yield
        finally:
            with self._lock:
                self.cost = saved
        with self._lock:
            self._busy_until = start + seconds
            self.sim.paced_s += seconds
            self.sim.paced_passes += 1
            self.sim.device_time_s += seconds
        if self.sleep:
            time.sleep(max(0.0, start + seconds - time.perf_counter()))

    def _shutdown(self) -> None:
        self._release_slots()

    def _timing_lines(self) -> list[str]:
        return [*super()._timing_lines(), self.sim.line()]
