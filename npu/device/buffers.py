"""Device data buffers and sub-buffers, always cut from a root, with their host mappings."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from npu.device.errors import DeviceError

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
