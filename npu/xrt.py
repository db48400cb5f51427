"""The NPU device over pyxrt: bundle kernels on /dev/accel/accel0, as taconite's XRT shim.

Follows docs/device.md (taconite iron_xrt_shim.cpp and taconite-adaface's LRU):
one pyxrt.device per process; one hw_context per (xclbin, kernel name) shared by its
kernels; instruction BOs `cacheable` in group_id(1); data BOs `host_only` in group 0;
kernel args (3, insts BO, insts bytes, *data BOs); a cached pyxrt.run per argument tuple.
pyxrt holds the GIL in every call (Xilinx/XRT pyxrt.cpp), so a dispatch is never waited for
with `run.wait()`: DeviceCore's wait polls `run.state()` (a read of the command's state
word) between GIL-free sleeps, paced by the kernel's measured time (docs/inference.md).
pyxrt is imported lazily and is never a pip dependency.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
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
    DeviceCore,
    DeviceError,
    DeviceLaunch,
    KernelSpec,
    KernelTiming,
    Parked,
    check_insts_stream,
    keep_forever,
    patched_insts,
)

log = logging.getLogger(__name__)

DEVICE_NODE = "/dev/accel/accel0"
# A kernel's expected dispatch time until WARM_SAMPLES completions are measured (its deadline
# is then 8 x this: 4 s, over the slowest upstream dispatch, CLIP ViT-H fc1's ~0.27 s); after
# that the measured time (KernelTiming.expected_s), never below EXPECTED_FLOOR_S.
FIRST_EXPECTED_S = 0.5
WARM_SAMPLES = 2
EXPECTED_FLOOR_S = 20e-6


def probe(device_node: str | None = None) -> tuple[ModuleType | None, list[str]]:
    """Import pyxrt and check the device node (default DEVICE_NODE); returns (pyxrt or
    None, what is missing)."""
    device_node = device_node or DEVICE_NODE
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
    pending: list[DeviceLaunch] = field(default_factory=list)
    freed: bool = False

    def in_flight(self, key: tuple[int, ...]) -> bool:
        return any(launch.key == key for launch in self.pending)

    def set_insts_words(self, words: Iterable[tuple[int, int]]) -> None:
        self.device.set_insts_words(self, words)


class XrtLaunch(DeviceLaunch):
    """A started pyxrt run (DeviceCore waits for it by polling run.state())."""

    def __init__(
        self, device: XrtDevice, kernel: XrtKernel, buffers: Sequence[Buffer], t0: float, run: Any
    ) -> None:
        super().__init__(device, kernel, buffers, t0)
        self.run = run


class XrtBuffer(Buffer):
    """A host_only BO (or a sub-BO of a root) with its uncached host mapping."""

    def __init__(self, bo: Any, host: np.ndarray, root: Buffer | None = None, offset: int = 0):
        super().__init__(host, root, offset)
        self.bo = bo


_device_lock = threading.Lock()
_device: XrtDevice | None = None


def xrt_device(device_node: str | None = None) -> XrtDevice:
    """The process's one XRT device (opened on first call; each pyxrt.device reopens the node)."""
    global _device
    with _device_lock:
        if _device is None or _device.closed:
            _device = XrtDevice(device_node)
            atexit.register(_device.close)  # the TACONITE_TIMING line, as Rust's Drop prints it
        return _device


class XrtDevice(DeviceCore[XrtKernel, XrtBuffer]):
    """The NPU through pyxrt. Use xrt_device(); one thread at a time (an internal lock)."""

    backend = "npu"
    label = "xrt"

    def __init__(self, device_node: str | None = None) -> None:
        device_node = device_node or DEVICE_NODE
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
        self._xclbins: dict[Path, tuple[Any, Any]] = {}
        super().__init__()

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

    def _destroy_context(self, key: str, ctx: _Context) -> None:
        ctx.hw_context = None

    def _unload(self, kernel: XrtKernel) -> None:
        """Drop the kernel's pyxrt objects (DeviceCore waited for its launches first)."""
        kernel.runs.clear()
        kernel.xk = kernel.insts_bo = None

    def _resident(self, kernel: XrtKernel) -> None:
        """Make kernel's context resident and its pyxrt kernel + instruction BO live."""
        spec = kernel.spec
        self._register(spec)
        ctx = self._contexts.acquire(spec.context_key, spec.owner)
        if kernel.xk is not None:
            return
        try:
            xk = self._x.kernel(ctx.hw_context, ctx.name)
            ib = self._x.bo(self._dev, len(spec.insts), self._x.bo.cacheable, xk.group_id(1))
            ib.write(patched_insts(spec.insts, kernel.patches).view(np.uint8), 0)
            ib.sync(self._to_dev)
        except Exception as exc:
            raise DeviceError(f"{spec.where()}: kernel {ctx.name} in {spec.xclbin}: {exc}") from exc
        kernel.xk, kernel.insts_bo = xk, ib

    def _new_kernel(self, spec: KernelSpec) -> XrtKernel:
        check_insts_stream(spec)
        return XrtKernel(self, spec)

    def _patch(self, kernel: XrtKernel, words: list[tuple[int, int]]) -> None:
        if kernel.insts_bo is not None and words:
            mapped = np.frombuffer(kernel.insts_bo.map(), np.uint32)
            for i, v in words:
                mapped[i] = v
            kernel.insts_bo.sync(self._to_dev)

    # buffers

    def _new_buffer(self, nbytes: int) -> XrtBuffer:
        try:
            bo = self._x.bo(self._dev, nbytes, self._x.bo.host_only, 0)
            host = np.frombuffer(bo.map(), np.uint8, count=nbytes)
            host[:] = 0
            bo.sync(self._to_dev)
        except Exception as exc:
            raise DeviceError(f"alloc({nbytes} bytes): {exc}") from exc
        return XrtBuffer(bo, host)

    def _new_sub(self, root: Buffer, offset: int, nbytes: int) -> XrtBuffer:
        assert isinstance(root, XrtBuffer)
        bo = self._x.bo(root.bo, nbytes, offset)
        return XrtBuffer(bo, root.host[offset : offset + nbytes], root, offset)

    def _drop_buffers(self, gone: list[Buffer]) -> None:
        """Drop the cached runs that use them, then their BOs."""
        ids = {b.id for b in gone}
        for kernel in (k for ks in self._users.values() for k in ks):
            for key in [k for k in kernel.runs if ids.intersection(k)]:
                del kernel.runs[key]
        for bid in ids:
            dead = self._buffers.pop(bid, None)
            if dead is not None:
                dead.freed = True
                dead.bo = None

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
            self._check_usable()
            self._reap()
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
            launch = XrtLaunch(self, kernel, buffers, t0, run)
            timing = kernel.timing
            measured = timing.samples >= WARM_SAMPLES and timing.expected_s is not None
            if measured:
                assert timing.expected_s is not None
                self._submitted(launch, max(timing.expected_s, EXPECTED_FLOOR_S), paced=True)
            else:
                self._submitted(launch, FIRST_EXPECTED_S, paced=False)
            return launch

    def _state(self, launch: XrtLaunch) -> int:
        return int(launch.run.state())

    def _retired(self, launch: XrtLaunch) -> None:
        launch.run = None  # a held handle must not keep the run (and its context) alive

    def _park(
        self, key: str, ctx: Any, kernels: list[XrtKernel], launches: list[XrtLaunch]
    ) -> list[Any]:
        """Detach the context's kernels (pyxrt kernel, instruction BO, cached runs) and give
        every buffer the hung runs touch a fresh BO (the device may still write the old
        ones); the old objects are returned to be kept, never destroyed."""
        kept: list[Any] = [ctx]
        for kernel in kernels:
            kept += [kernel.xk, kernel.insts_bo, *kernel.runs.values()]
            kernel.runs = {}
            kernel.xk = kernel.insts_bo = None
        kept += [launch.run for launch in launches]
        roots = {id(b.root): b.root for launch in launches for b in launch.buffers}
        for root in roots.values():
            if not root.freed:
                assert isinstance(root, XrtBuffer)
                kept += self._renew(root)
        return kept

    def _renew(self, root: XrtBuffer) -> list[Any]:
        """Move a root buffer and its subs to a fresh BO holding the same bytes; returns the
        old BOs and the cached runs that used them."""
        try:
            bo = self._x.bo(self._dev, root.nbytes, self._x.bo.host_only, 0)
            host = np.frombuffer(bo.map(), np.uint8, count=root.nbytes)
            np.copyto(host, root.host)
            bo.sync(self._to_dev)
        except Exception as exc:
            raise DeviceError(
                f"alloc({root.nbytes} bytes) replacing a parked buffer: {exc}"
            ) from exc
        old: list[Any] = [root.bo]
        root.bo, root.host = bo, host
        for sub in root.subs:
            assert isinstance(sub, XrtBuffer)
            old.append(sub.bo)
            sub.bo = self._x.bo(bo, sub.nbytes, sub.offset)
            sub.host = host[sub.offset : sub.offset + sub.nbytes]
        ids = {root.id, *(sub.id for sub in root.subs)}
        for kernel in (k for ks in self._users.values() for k in ks):
            for key in [k for k in kernel.runs if ids.intersection(k)]:
                old.append(kernel.runs.pop(key))
        return old

    def _release_parked(self, parked: Parked) -> None:
        parked.objects.clear()  # every run finished: their destructors no longer wait

    def _close_parked(self) -> bool:
        """Skip XRT's teardown: a destructor of a parked object, or of anything sharing the
        device with it, may block in the driver. The process's exit frees the contexts."""
        log.warning(
            "%s: %d context(s) parked with hung dispatches: XRT teardown skipped",
            self.label,
            len(self._parked),
        )
        keep_forever(self)
        return False

    def _shutdown(self) -> None:
        self._xclbins.clear()
        self._dev = None

    def close(self) -> None:
        """Free every kernel, buffer and context; print the TACONITE_TIMING line if on."""
        global _device
        super().close()
        with _device_lock:
            if _device is self:
                _device = None
