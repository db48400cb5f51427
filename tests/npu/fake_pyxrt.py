"""A recording fake of XRT's pyxrt module (the names of Xilinx/XRT src/python/pybind11).

Tests inject it with `monkeypatch.setitem(sys.modules, "pyxrt", fake_pyxrt)` after reset().
Every call lands in `calls` as a tuple. Hardware contexts count against a machine-wide
`limit` and free their slot when garbage-collected, as a released xrt::hw_context does; a
full machine raises RuntimeError mentioning CREATE_HWCTX, as the amdxdna driver does.
"""

from __future__ import annotations

import enum
import itertools
from typing import Any

import numpy as np

calls: list[tuple[Any, ...]] = []
live_contexts: set[int] = set()
limit = 16
fail_contexts = 0  # the next n hw_context creations raise a non-"full" error
next_states: list[int] = []  # states returned by the next waits (default COMPLETED)
_ids = itertools.count(1)


def reset(hwctx_limit: int = 16) -> None:
    global limit, fail_contexts, _ids
    calls.clear()
    live_contexts.clear()
    next_states.clear()
    limit = hwctx_limit
    fail_contexts = 0
    _ids = itertools.count(1)


def of(name: str) -> list[tuple[Any, ...]]:
    """The recorded calls named `name`."""
    return [c for c in calls if c[0] == name]


class xclBOSyncDirection(enum.IntEnum):  # noqa: N801 (pyxrt's spelling)
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1


class ert_cmd_state(enum.IntEnum):  # noqa: N801
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_RUNNING = 3
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_TIMEOUT = 8


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
        calls.append(("xclbin", path))

    def get_kernels(self) -> list[_KernelInfo]:
        return [_KernelInfo()]


class device:  # noqa: N801
    def __init__(self, index: int) -> None:
        calls.append(("device", index))

    def register_xclbin(self, xb: xclbin) -> uuid:
        calls.append(("register_xclbin", xb.path))
        return uuid(xb.path)


class hw_context:  # noqa: N801
    def __init__(self, dev: device, id_: uuid) -> None:
        global fail_contexts
        if fail_contexts:
            fail_contexts -= 1
            calls.append(("hw_context.fail", id_.path))
            raise ValueError("xclbin is corrupt")
        if len(live_contexts) >= limit:
            calls.append(("hw_context.full", id_.path))
            raise RuntimeError(
                "DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-16): Device or resource busy"
            )
        self.id = next(_ids)
        self.path = id_.path
        live_contexts.add(self.id)
        calls.append(("hw_context", id_.path))

    def __del__(self) -> None:
        if getattr(self, "id", None) in live_contexts:
            live_contexts.discard(self.id)
            calls.append(("hw_context.free", self.path))


class kernel:  # noqa: N801
    def __init__(self, ctx: hw_context, name: str) -> None:
        self.ctx = ctx
        self.name = name
        calls.append(("kernel", ctx.path, name))

    def group_id(self, i: int) -> int:
        return 100 + i  # distinct from i, so a test sees that the kernel was asked


class bo:  # noqa: N801
    normal = 0
    cacheable = 1 << 24
    host_only = 1 << 29

    def __init__(self, *args: Any) -> None:
        self.id = next(_ids)
        if isinstance(args[0], bo):
            parent, size, offset = args
            self.parent, self.offset = parent, offset
            self.storage = parent.storage
            self.base = parent.base + offset  # a sub of a sub takes its host pointer this way
            calls.append(("bo.sub", parent.id, size, offset, self.id))
        else:
            _, size, flags, group = args
            self.parent, self.offset, self.base = None, 0, 0
            self.storage = np.full(size, 0xAB, np.uint8)  # not zeroed: the device must zero
            calls.append(("bo", size, flags, group, self.id))
        self.nbytes = size

    def map(self) -> memoryview:
        return memoryview(self.storage[self.base : self.base + self.nbytes])

    def write(self, data: Any, offset: int) -> None:
        raw = np.frombuffer(bytes(data), np.uint8)
        self.storage[self.base + offset : self.base + offset + raw.size] = raw
        calls.append(("bo.write", self.id, raw.size, offset))

    def sync(self, direction: xclBOSyncDirection, *rest: int) -> None:
        calls.append(("sync", self.id, xclBOSyncDirection(direction).name, *rest))

    def size(self) -> int:
        return self.nbytes


class run:  # noqa: N801
    def __init__(self, k: kernel) -> None:
        self.id = next(_ids)
        self.kernel = k
        self.args: dict[int, Any] = {}
        calls.append(("run", self.id, k.name))

    def set_arg(self, i: int, value: Any) -> None:
        self.args[i] = value
        shown = value.id if isinstance(value, bo) else value
        calls.append(("set_arg", self.id, i, type(value).__name__, shown))

    def start(self) -> None:
        calls.append(("start", self.id))

    def wait(self, timeout_ms: int | None = None) -> ert_cmd_state:
        calls.append(("wait", self.id))
        return (
            ert_cmd_state(next_states.pop(0))
            if next_states
            else (ert_cmd_state.ERT_CMD_STATE_COMPLETED)
        )
