"""Large host arrays on ordinary pages. numpy advises transparent huge pages for every array of
4 MB or more (madvise MADV_HUGEPAGE; numpy's "Kernel huge pages" notes), and with the
kernel's THP defrag setting `madvise` (the default) the first touch of such an array may stall
in direct compaction for tens of milliseconds, on whichever thread writes it first. An
anonymous mapping of Python's mmap module gets no such advice, so its pages fault in one at a
time (docs/inference.md, "Sapiens2: host glue overlapped with the device").
"""

from __future__ import annotations

import math
import mmap

import numpy as np


def empty(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """An uninitialised array like np.empty(shape, dtype), C order, on ordinary pages (zero
    until written); its memory goes back to the system when the array is collected."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes == 0:
        return np.empty(shape, dt)
    return np.frombuffer(mmap.mmap(-1, nbytes), dt).reshape(shape)
