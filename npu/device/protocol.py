"""What model runtimes need of a device (XrtDevice or SimDevice), and the run states both
report (XRT's ert.h values, compared by value: pyxrt's enum has no RUNNING member).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from npu.device.buffers import Buffer
from npu.device.contexts import DeviceStats, ModelContexts
from npu.device.kernels import Kernel, KernelSpec
from npu.device.steps import Launch

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
