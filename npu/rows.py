"""Host work split into row chunks on a small persistent thread pool, as taconite's
`cpu::par_rows` (taconite/src/cpu.rs): the caller and `threads - 1` workers take chunks in
turn. numpy releases the GIL inside its ufunc loops and casts, so the chunks of one call run
on several cores; each chunk is small enough to stay in the core's cache between the passes
a caller makes over it.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from npu import thread_priority

THREADS_ENV = "NPUCAM_HOST_THREADS"
MAX_THREADS = 16  # taconite's threads() cap


def host_threads(environ: dict[str, str] | None = None) -> int:
    """Threads for host glue: `NPUCAM_HOST_THREADS` if it is an int >= 1, else half the CPUs
    this process may run on (at least 1, at most 16). taconite takes every core; npucam's
    NPU stage shares the host with capture, detection and publish, and its glue is
    memory-bound: on 2 cores a second thread cut 0.4b's glue wall by ~30% but cost ~20% more
    CPU per box, while one thread's wall is still well under the box's device time
    (docs/benchmarks.md, pose_host)."""
    env = os.environ if environ is None else environ
    raw = env.get(THREADS_ENV, "")
    if raw.isdigit() and int(raw) >= 1:
        return min(int(raw), MAX_THREADS)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus // 2, MAX_THREADS))


class RowPool:
    """`run(rows, chunk, fn)` calls fn(r0, r1) over [0, rows) in chunks of `chunk` rows, on
    the calling thread and the pool's workers, and returns when all are done (the first
    exception is raised). Chunks must not overlap in what they write; fn must not call run.
    The first chunk runs on the caller before the workers start, so the first call of a
    numba-compiled loop (which compiles it or loads it from its cache, not safe from two
    threads at once) is never made concurrently."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool = (
            ThreadPoolExecutor(
                self.threads - 1,
                thread_name_prefix="npucam-rows",
                initializer=thread_priority.lower_this_thread,
            )
            if self.threads > 1
            else None
        )

    def run(self, rows: int, chunk: int, fn: Callable[[int, int], None]) -> None:
        chunk = max(1, chunk)
        starts = range(0, rows, chunk)
        if self._pool is None or len(starts) < 2:
            for r0 in starts:
                fn(r0, min(r0 + chunk, rows))
            return
        fn(0, min(chunk, rows))
        counter = itertools.count(1)  # next() of a count is atomic under the GIL
        failed: list[BaseException] = []

        def work() -> None:
            while not failed:
                i = next(counter)
                if i >= len(starts):
                    return
                r0 = starts[i]
                try:
                    fn(r0, min(r0 + chunk, rows))
                except BaseException as exc:
                    failed.append(exc)

        helpers: list[Future] = [
            self._pool.submit(work) for _ in range(min(self.threads - 1, len(starts) - 1))
        ]
        work()
        for f in helpers:
            f.result()
        if failed:
            raise failed[0]


_pool: RowPool | None = None
_pool_lock = threading.Lock()


def row_pool() -> RowPool:
    """The process's RowPool of host_threads() threads (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = RowPool(host_threads())
        return _pool
