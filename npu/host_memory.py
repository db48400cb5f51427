"""Large host arrays faulted in ahead of use. numpy advises transparent huge pages for every
array of 4 MB or more (madvise MADV_HUGEPAGE; numpy's "Kernel huge pages" notes), and with
the kernel's THP defrag setting `madvise` (the default) the first touch of such an array may
stall in direct compaction for tens of milliseconds (measured: 100-180 ms for a 60 MB
heatmap array on a busy 2-core VM), on whichever thread writes it first. Touching its pages
once on a thread that can wait (the infer stage's prepare thread) keeps that off the thread
that feeds the device (docs/inference.md, "Sapiens2: host glue overlapped with the device").
"""

from __future__ import annotations

import mmap

import numpy as np


def faulted(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """np.empty(shape, dtype) with every page written once (so its values are unspecified,
    as np.empty's): later writes take no page faults."""
    out = np.empty(shape, dtype)
    out.reshape(-1).view(np.uint8)[:: mmap.PAGESIZE] = 0
    return out
