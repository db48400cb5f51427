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

One module per concern: errors, protocol (Device and the run states), kernels, buffers,
contexts, steps (stepped computations), core (DeviceCore and the wait); this package's names
are theirs. The factory, open_device, is npu.backends: nothing here imports a device.
"""

from npu.device.buffers import Buffer, check_sub_range, next_buffer_id
from npu.device.contexts import (
    CONTEXT_WAIT_S,
    CONTEXT_WAITS,
    DEFAULT_CTX_CACHE,
    ContextCache,
    DeviceStats,
    ModelContexts,
    context_full,
    ctx_cache_cap,
)
from npu.device.core import (
    DeviceCore,
    DeviceLaunch,
    LoadedKernel,
    Parked,
    WaitPolicy,
    keep_forever,
    timing_enabled,
)
from npu.device.errors import DeviceError, DeviceFailed, DeviceInterrupted, DeviceTimeout
from npu.device.kernels import (
    EWMA_ALPHA,
    Kernel,
    KernelSpec,
    KernelTiming,
    check_insts_stream,
    check_insts_words,
    context_key,
    kernel_key,
    kernel_spec,
    patched_insts,
)
from npu.device.protocol import (
    ERT_CMD_STATE_COMPLETED,
    ERT_CMD_STATE_ERROR,
    ERT_CMD_STATE_NEW,
    ERT_CMD_STATE_QUEUED,
    ERT_CMD_STATE_RUNNING,
    ERT_CMD_STATE_SUBMITTED,
    ERT_CMD_STATE_TIMEOUT,
    IN_FLIGHT_STATES,
    Device,
)
from npu.device.steps import INTERLEAVE, Launch, Steps, busy_steps, run_steps, wait_all

__all__ = [
    "DeviceError",
    "DeviceTimeout",
    "DeviceFailed",
    "DeviceInterrupted",
    "ERT_CMD_STATE_NEW",
    "ERT_CMD_STATE_QUEUED",
    "ERT_CMD_STATE_RUNNING",
    "ERT_CMD_STATE_COMPLETED",
    "ERT_CMD_STATE_ERROR",
    "ERT_CMD_STATE_SUBMITTED",
    "ERT_CMD_STATE_TIMEOUT",
    "IN_FLIGHT_STATES",
    "Device",
    "context_key",
    "KernelSpec",
    "kernel_key",
    "kernel_spec",
    "check_insts_words",
    "EWMA_ALPHA",
    "KernelTiming",
    "Kernel",
    "check_insts_stream",
    "patched_insts",
    "next_buffer_id",
    "Buffer",
    "check_sub_range",
    "DEFAULT_CTX_CACHE",
    "CONTEXT_WAITS",
    "CONTEXT_WAIT_S",
    "ctx_cache_cap",
    "DeviceStats",
    "context_full",
    "ModelContexts",
    "ContextCache",
    "Launch",
    "Steps",
    "wait_all",
    "run_steps",
    "busy_steps",
    "INTERLEAVE",
    "WaitPolicy",
    "timing_enabled",
    "LoadedKernel",
    "DeviceLaunch",
    "Parked",
    "keep_forever",
    "DeviceCore",
]
