"""npu/thread_priority.py: the NPU stage's host threads get NPU_THREAD_NICE, the thread only,
not the process (Linux per-thread nice); the host-glue pool's workers too."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from npu.rows import RowPool
from npu.thread_priority import NPU_THREAD_NICE, lower_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux nice")


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_only_the_calling_thread_is_lowered():
    before = _nice_of_this_thread()
    seen = []

    def lowered() -> None:
        lower_this_thread()
        seen.append(_nice_of_this_thread())

    thread = threading.Thread(target=lowered)
    thread.start()
    thread.join()
    assert seen == [max(before, NPU_THREAD_NICE)]
    assert _nice_of_this_thread() == before  # the caller, and so the process, keeps its own


def test_the_host_glue_pools_workers_run_lowered():
    pool = RowPool(2)
    nices: dict[int, int] = {}
    lock = threading.Lock()

    def chunk(r0: int, r1: int) -> None:
        with lock:
            nices[threading.get_native_id()] = _nice_of_this_thread()
        threading.Event().wait(0.01)  # long enough for the worker to take chunks too

    pool.run(40, 1, chunk)
    caller = threading.get_native_id()
    workers = {tid: n for tid, n in nices.items() if tid != caller}
    assert workers and all(n >= NPU_THREAD_NICE for n in workers.values()), nices


def test_the_device_thread_opens_at_the_process_priority_and_is_lowered_after():
    from stages.device_thread import DeviceThread

    before = _nice_of_this_thread()
    device = DeviceThread("test-device")
    try:
        opening = device.submit("loading the models", _nice_of_this_thread).result(5)
        device.lower_priority().result(5)
        serving = device.submit("a batch", _nice_of_this_thread).result(5)
    finally:
        device.shutdown()
        device.join(5)
    assert (opening, serving) == (before, max(before, NPU_THREAD_NICE))
