"""npu.host_memory.faulted: an array whose pages are already in, so that writing it on the
device thread takes no page faults (counted by the kernel: getrusage's minor faults)."""

from __future__ import annotations

import mmap
import resource
import threading

import numpy as np

from npu.host_memory import faulted

SHAPE = (64, 256, 256)  # 16 MB of float32: 4096 pages of 4 KB


def faults_writing(make) -> tuple[int, np.ndarray]:
    """Minor page faults of this thread while it fills a new array from `make()`, which runs
    on another thread (as the prepare thread allocates for the device thread)."""
    box: list[np.ndarray] = []
    t = threading.Thread(target=lambda: box.append(make()))
    t.start()
    t.join()
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    box[0][...] = 1.5
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before, box[0]


def test_a_faulted_array_is_written_without_page_faults():
    pages = np.prod(SHAPE) * 4 // mmap.PAGESIZE
    fresh, _ = faults_writing(lambda: np.empty(SHAPE, np.float32))
    ready, arr = faults_writing(lambda: faulted(SHAPE))
    assert fresh >= 8  # a fresh array faults in as it is written (huge pages: 1 per 2 MB)
    assert ready <= pages // 100, (ready, fresh)
    assert arr.shape == SHAPE and arr.dtype == np.float32 and arr.flags.c_contiguous
    assert (arr == 1.5).all()
