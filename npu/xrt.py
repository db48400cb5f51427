"""The NPU device over pyxrt: bundle kernels on /dev/accel/accel0, as taconite's XRT shim.

Follows specs/bundle-and-xrt.md §2 (taconite iron_xrt_shim.cpp and taconite-adaface's LRU):
one pyxrt.device per process; one hw_context per (xclbin, kernel name) shared by its
kernels; instruction BOs `cacheable` in group_id(1); data BOs `host_only` in group 0;
kernel args (3, insts BO, insts bytes, *data BOs); a cached pyxrt.run per argument tuple.
pyxrt is imported lazily and is never a pip dependency.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from npu.device import (
    Buffer,
    ContextCache,
    DeviceError,
    DeviceStats,
    KernelSpec,
    KernelTiming,
    check_insts_words,
    check_sub_range,
    ctx_cache_cap,
    timing_enabled,
)

DEVICE_NODE = "/dev/accel/accel0"


def probe(device_node: str = DEVICE_NODE) -> tuple[ModuleType | None, list[str]]:
    """Import pyxrt and check the device node; returns (pyxrt or None, what is missing)."""
    missing = []
    module = None
    try:
        module = importlib.import_module("pyxrt")
    except ModuleNotFoundError as exc:
        if exc.name != "pyxrt":
            missing.append(f"XRT: pyxrt failed to import ({exc})")
        else:
            xrt_home = os.environ.get("XILINX_XRT", "/opt/xilinx/xrt")
            where = "" if Path(xrt_home).is_dir() else f" ({xrt_home} does not exist)"
            missing.append(
                "pyxrt: not importable; install XRT with its Python bindings and "
                f"`source /opt/xilinx/xrt/setup.sh`{where}"
            )
    except ImportError as exc:
        missing.append(f"XRT: pyxrt is present but its libraries failed to load ({exc})")
    if not Path(device_node).exists():
        missing.append(
            f"device: no {device_node} (no XDNA NPU, or the amdxdna driver is not loaded)"
        )
    return module, missing


@dataclass
class _Context:
    """A resident hardware context and the registered xclbin it came from."""

    hw_context: Any
    uuid: Any
    name: str


@dataclass
class XrtKernel:
    """A loaded kernel. Its pyxrt kernel, instruction BO and runs exist while its context is
    resident; `patches` are re-applied whenever they are rebuilt."""

    device: XrtDevice
    spec: KernelSpec
    patches: dict[int, int] = field(default_factory=dict)
    timing: KernelTiming = field(default_factory=KernelTiming)
    xk: Any = None
    insts_bo: Any = None
    runs: dict[tuple[int, ...], Any] = field(default_factory=dict)
    pending: list[XrtLaunch] = field(default_factory=list)
    freed: bool = False

    def in_flight(self, key: tuple[int, ...]) -> bool:
        return any(launch.key == key for launch in self.pending)

    def set_insts_words(self, words: Iterable[tuple[int, int]]) -> None:
        self.device.set_insts_words(self, words)


class XrtLaunch:
    """A started pyxrt run; wait() checks ERT_CMD_STATE_COMPLETED."""

    def __init__(self, device: XrtDevice, kernel: XrtKernel, key: tuple[int, ...], run: Any):
        self._device, self.kernel, self.key, self.run = device, kernel, key, run
        self.t0 = self.t_start = time.perf_counter()
        self._done: float | None = None
        self._error: DeviceError | None = None

    def wait(self) -> float:
        if self._done is None and self._error is None:
            self._device._finish(self)
        if self._error is not None:
            raise self._error
        assert self._done is not None
        return self._done


class XrtBuffer(Buffer):
    """A host_only BO (or a sub-BO of a root) with its uncached host mapping."""

    def __init__(self, bo: Any, host: np.ndarray, root: Buffer | None = None, offset: int = 0):
        super().__init__(host, root, offset)
        self.bo = bo


_device_lock = threading.Lock()
_device: XrtDevice | None = None


def open_device(device_node: str = DEVICE_NODE) -> XrtDevice:
    """The process's one XRT device (opened on first call; each pyxrt.device reopens the node)."""
    global _device
    with _device_lock:
        if _device is None or _device.closed:
            _device = XrtDevice(device_node)
            atexit.register(_device.close)  # the TACONITE_TIMING line, as Rust's Drop prints it
        return _device


class XrtDevice:
    """The NPU through pyxrt. Use open_device(); one thread at a time (an internal lock)."""

    backend = "npu"

    def __init__(self, device_node: str = DEVICE_NODE) -> None:
        pyxrt, missing = probe(device_node)
        if missing or pyxrt is None:
            raise DeviceError("the npu backend is unavailable: " + "; ".join(missing))
        self._x = pyxrt
        try:
            self._dev = pyxrt.device(0)
        except Exception as exc:
            raise DeviceError(f"XRT could not open device 0 ({device_node}): {exc}") from exc
        self._to_dev = pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        self._from_dev = pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE
        self._lock = threading.RLock()
        self.stats = DeviceStats()
        self._timing = timing_enabled()
        self._xclbins: dict[Path, tuple[Any, Any]] = {}
        self._users: dict[str, list[XrtKernel]] = {}
        self._contexts = ContextCache(
            ctx_cache_cap(), self._create_context, self._release_context, self.stats
        )
        self._buffers: dict[int, XrtBuffer] = {}
        self.closed = False

    # contexts and kernels

    def _create_context(self, key: str) -> _Context:
        path, name = key.split("\n", 1)
        _, uuid = self._xclbins[Path(path)]
        return _Context(self._x.hw_context(self._dev, uuid), uuid, name)

    def _register(self, spec: KernelSpec) -> None:
        """Parse and register an xclbin once per device (outside the evict-and-retry loop, so
        a bad file never evicts resident contexts)."""
        if spec.xclbin not in self._xclbins:
            try:
                xb = self._x.xclbin(str(spec.xclbin))
                self._xclbins[spec.xclbin] = (xb, self._dev.register_xclbin(xb))
            except Exception as exc:
                raise DeviceError(f"{spec.where()}: xclbin {spec.xclbin}: {exc}") from exc

    def _release_context(self, key: str, ctx: _Context) -> None:
        for kernel in self._users.get(key, []):
            self._drop_runs(kernel)
        ctx.hw_context = None

    def _drop_runs(self, kernel: XrtKernel) -> None:
        """Wait for the kernel's launches in flight, then drop its pyxrt objects."""
        for launch in list(kernel.pending):
            self._finish(launch)
        kernel.runs.clear()
        kernel.xk = kernel.insts_bo = None

    def _resident(self, kernel: XrtKernel) -> None:
        """Make kernel's context resident and its pyxrt kernel + instruction BO live."""
        spec = kernel.spec
        self._register(spec)
        ctx = self._contexts.acquire(spec.context_key)
        if kernel.xk is not None:
            return
        try:
            xk = self._x.kernel(ctx.hw_context, ctx.name)
            ib = self._x.bo(self._dev, len(spec.insts), self._x.bo.cacheable, xk.group_id(1))
            words = np.frombuffer(spec.insts, np.uint32).copy()
            for i, v in kernel.patches.items():
                words[i] = v
            ib.write(words.view(np.uint8), 0)
            ib.sync(self._to_dev)
        except Exception as exc:
            raise DeviceError(f"{spec.where()}: kernel {ctx.name} in {spec.xclbin}: {exc}") from exc
        kernel.xk, kernel.insts_bo = xk, ib

    def load(self, spec: KernelSpec) -> XrtKernel:
        with self._lock:
            self._check_open()
            if len(spec.insts) % 4 or not spec.insts:
                raise DeviceError(f"{spec.where()}: the instruction stream is not whole u32 words")
            kernel = XrtKernel(self, spec)
            kernel.timing = self.stats.kernels.setdefault(spec.key, kernel.timing)
            self._users.setdefault(spec.context_key, []).append(kernel)
            try:
                self._resident(kernel)
            except BaseException:
                self._forget(kernel)
                raise
            return kernel

    def _forget(self, kernel: XrtKernel) -> None:
        key = kernel.spec.context_key
        users = self._users.get(key, [])
        if kernel in users:
            users.remove(kernel)
        if not users:
            self._users.pop(key, None)
            self._contexts.drop(key)

    def free_kernel(self, kernel: XrtKernel) -> None:
        with self._lock:
            if kernel.freed:
                return
            self._drop_runs(kernel)
            kernel.freed = True
            self._forget(kernel)

    def resident_contexts(self) -> list[str]:
        return self._contexts.keys()

    def set_insts_words(self, kernel: XrtKernel, words: Iterable[tuple[int, int]]) -> None:
        with self._lock:
            checked = check_insts_words(len(kernel.spec.insts), words)
            if kernel.pending:
                raise DeviceError(
                    f"{kernel.spec.key}: instruction patch while a launch is in flight"
                )
            kernel.patches.update(checked)
            if kernel.insts_bo is not None and checked:
                mapped = np.frombuffer(kernel.insts_bo.map(), np.uint32)
                for i, v in checked:
                    mapped[i] = v
                kernel.insts_bo.sync(self._to_dev)

    # buffers

    def alloc(self, nbytes: int) -> XrtBuffer:
        with self._lock:
            self._check_open()
            if nbytes <= 0:
                raise DeviceError(f"a buffer needs at least one byte, asked for {nbytes}")
            try:
                bo = self._x.bo(self._dev, nbytes, self._x.bo.host_only, 0)
                host = np.frombuffer(bo.map(), np.uint8, count=nbytes)
                host[:] = 0
                bo.sync(self._to_dev)
            except Exception as exc:
                raise DeviceError(f"alloc({nbytes} bytes): {exc}") from exc
            buf = XrtBuffer(bo, host)
            self._buffers[buf.id] = buf
            return buf

    def sub(self, buf: Buffer, offset: int, nbytes: int) -> XrtBuffer:
        with self._lock:
            buf.check_live()
            check_sub_range(buf.nbytes, offset, nbytes)
            root = buf.root
            assert isinstance(root, XrtBuffer)
            at = buf.offset + offset
            bo = self._x.bo(root.bo, nbytes, at)
            sub = XrtBuffer(bo, root.host[at : at + nbytes], root, at)
            root.subs.append(sub)
            self._buffers[sub.id] = sub
            return sub

    def free(self, buf: Buffer) -> None:
        with self._lock:
            gone = {buf.id} | ({s.id for s in buf.subs} if buf.root is buf else set())
            for kernel in (k for ks in self._users.values() for k in ks):
                for key in [k for k in kernel.runs if gone.intersection(k)]:
                    del kernel.runs[key]
            for bid in gone:
                dead = self._buffers.pop(bid, None)
                if dead is not None:
                    dead.freed = True
                    dead.bo = None
            if buf.root is not buf and buf in buf.root.subs:
                buf.root.subs.remove(buf)

    def to_device(self, buf: Buffer) -> None:
        assert isinstance(buf, XrtBuffer)
        buf.check_live()
        buf.bo.sync(self._to_dev)

    def from_device(self, buf: Buffer) -> None:
        assert isinstance(buf, XrtBuffer)
        buf.check_live()
        buf.bo.sync(self._from_dev)

    # runs

    def start(self, kernel: XrtKernel, buffers: Sequence[Buffer]) -> XrtLaunch:
        with self._lock:
            self._check_open()
            if kernel.freed:
                raise DeviceError(f"{kernel.spec.key}: kernel was freed")
            t0 = time.perf_counter()
            for b in buffers:
                b.check_live()
            self._resident(kernel)
            key = tuple(b.id for b in buffers)
            busy = kernel.in_flight(key)
            run = None if busy else kernel.runs.get(key)
            try:
                if run is None:
                    run = self._x.run(kernel.xk)
                    run.set_arg(0, 3)
                    run.set_arg(1, kernel.insts_bo)
                    run.set_arg(2, len(kernel.spec.insts))
                    for i, b in enumerate(buffers):
                        assert isinstance(b, XrtBuffer)
                        run.set_arg(3 + i, b.bo)
                    if not busy:
                        kernel.runs[key] = run
                run.start()
            except Exception as exc:
                kernel.runs.pop(key, None)
                raise DeviceError(f"{kernel.spec.key}: launch failed: {exc}") from exc
            launch = XrtLaunch(self, kernel, key, run)
            launch.t0 = t0
            kernel.pending.append(launch)
            return launch

    def _finish(self, launch: XrtLaunch) -> None:
        with self._lock:
            kernel = launch.kernel
            if launch not in kernel.pending:
                return
            try:
                state = launch.run.wait()
            except Exception as exc:
                launch._error = DeviceError(f"{kernel.spec.key}: run.wait failed: {exc}")
                return
            finally:
                kernel.pending.remove(launch)
                launch.run = None  # a held handle must not keep the run (and its context) alive
            t1 = time.perf_counter()
            wall, waited = t1 - launch.t0, t1 - launch.t_start
            for timing in (self.stats, kernel.timing):
                timing.runs += 1
                timing.run_s += wall
                timing.wait_s += waited
            if state != self._x.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                launch._error = DeviceError(f"kernel finished in state {int(state)}")
                return
            launch._done = wall

    def run(self, kernel: XrtKernel, buffers: Sequence[Buffer]) -> float:
        return self.start(kernel, buffers).wait()

    def _check_open(self) -> None:
        if self.closed:
            raise DeviceError("the xrt device is closed")

    def close(self) -> None:
        """Free every kernel, buffer and context; print the TACONITE_TIMING line if on."""
        global _device
        with self._lock:
            if self.closed:
                return
            for kernel in [k for ks in self._users.values() for k in ks]:
                self.free_kernel(kernel)
            self._contexts.clear()
            for buf in list(self._buffers.values()):
                buf.freed = True
                buf.bo = None
            self._buffers.clear()
            self._xclbins.clear()
            self._dev = None
            self.closed = True
            if self._timing:
                print(self.stats.line("xrt"), file=sys.stderr)
        with _device_lock:
            if _device is self:
                _device = None
