"""The NPU stage's host threads (device thread, prepare thread, host-glue pool) run at a lower
CPU priority than capture, detection and publish: their work has the device's time as slack,
the camera path's has a frame's (the device thread once its models are open). Linux
per-thread nice (setpriority on the thread's id)."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)
# Niceness of the NPU stage's host threads: weight ~110 against 1024 at nice 0 (CFS), so a
# detection thread that wants a core gets it first. With the GIL-holding fake at NPU2 dispatch
# times and every model busy, the det path's p95 lag went from 1.13-1.22x its idle value to
# 1.04x (tests/reliability/test_npu_gil.py; docs/inference.md).
NPU_THREAD_NICE = 10


def lower_this_thread() -> None:
    """Give the calling thread NPU_THREAD_NICE (Linux only: elsewhere setpriority with a
    thread id would renice the whole process, so it is left as it is)."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if current < NPU_THREAD_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, NPU_THREAD_NICE)
    except OSError as exc:  # a sandbox that forbids it: the threads keep the default
        log.warning(
            "cannot lower the priority of thread %s: %s", threading.current_thread().name, exc
        )
