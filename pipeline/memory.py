"""glibc malloc settings for a long-running stream: arenas capped at DEFAULT_ARENAS, frame-sized
blocks kept in them (fixed thresholds), their free pages handed back every TRIM_INTERVAL_S.

glibc gives each thread that allocates its own arena, up to 8 per core (16 on a 2-core host),
and raises its mmap threshold to the largest block freed (up to 32 MiB), so after the first
frames the frame- and batch-sized numpy buffers come from the arenas, not from mmap, and each
arena keeps the free blocks of its own peak. In a 6-minute sim soak (bench/soak.py) malloc_info
showed 16 arenas holding 298 MB, 183 MB of it free, and RSS stepping up whenever a thread
reached a new peak in its arena (+5.5% after warm-up: the 5% gate failed); with 2 arenas,
157 MB held, 49 MB free, RSS +0.35% (docs/benchmarks.md). A fixed mmap threshold (1 MiB) kept
RSS flat too, but every frame-sized buffer was then fresh pages: 4 ms instead of 0.6 ms to
copy and convert one 1280x720 frame. Two arenas still keep the pages of their highest peak: a
30-minute soak with the cap alone stepped up 20 MB at 600 s, with no new thread, and failed at
+9.6%; so the free pages of every arena are also handed back (malloc_trim) every
TRIM_INTERVAL_S, and the 30-minute soak then passed at -0.1%. MALLOC_ARENA_MAX in the
environment, which glibc reads at startup, takes precedence; other C libraries are left alone.

glibc's own thresholds move: the mmap threshold rises to the largest block freed, and the trim
threshold to twice that, so an arena whose top holds two free frames hands their pages back on
the spot and the next two frames are fresh pages again (one page fault per 4 KiB: ~1.2 ms for a
1080p frame). A `zmq:` camera receiving raw 1080p frames fell into that on some runs and then
kept up with 0.6x a bare pyzmq receiver's rate (docs/benchmarks.md, frame_transport); so the
mmap threshold is fixed at glibc's ceiling (blocks up to 32 MiB, a 4K frame's 25 MB, come from
the arenas, as they would after warm-up) and the trim threshold at twice that, the highest
glibc's own rule reaches: up to 64 MiB free at an arena's top stays for the next frames, and
the periodic trim hands it back. MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (or
GLIBC_TUNABLES) in the environment win here too. Called by pipeline/entry.py only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time

log = logging.getLogger(__name__)

DEFAULT_ARENAS = 2
# glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
TRIM_INTERVAL_S = 10.0
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # the highest glibc's own rule sets (twice the mmap one)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _mallopt(*settings: tuple[int, int]) -> bool:
    """mallopt(param, value) for each setting in turn, stopping at the first refused: True if
    every one was set (False: the C library has no mallopt, or it refused one)."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all(mallopt(param, value) == 1 for param, value in settings)


def cap_malloc_arenas(arenas: int = DEFAULT_ARENAS) -> bool:
    """Limit glibc to `arenas` malloc arenas from now on, unless MALLOC_ARENA_MAX is set.

    Call it before the worker threads start. Returns True if the cap was set (False: the
    environment sets one, or the C library has no mallopt, or refused it)."""
    if arenas < 1:
        raise ValueError(f"arenas must be >= 1, got {arenas}")
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    ok = _mallopt((M_ARENA_MAX, arenas))
    log.debug("malloc arenas capped at %d: %s", arenas, ok)
    return ok


def fix_malloc_thresholds(
    mmap_bytes: int = MMAP_THRESHOLD, trim_bytes: int = TRIM_THRESHOLD
) -> bool:
    """Fix glibc's mmap and trim thresholds (module docstring), unless the environment sets
    either. True if both were set (False: the environment sets one, or the C library has no
    mallopt, or refused a value)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")) or any(
        k in tunables for k in ("mmap_threshold", "trim_threshold")
    ):
        return False
    ok = _mallopt((M_MMAP_THRESHOLD, mmap_bytes), (M_TRIM_THRESHOLD, trim_bytes))
    log.debug("malloc thresholds: mmap %d, trim %d bytes: %s", mmap_bytes, trim_bytes, ok)
    return ok


def start_trimming(interval_s: float = TRIM_INTERVAL_S) -> threading.Thread | None:
    """Every interval_s, hand the memory glibc's arenas hold free back to the OS
    (malloc_trim(0): the free pages anywhere in every arena, not only at their tops), on a
    daemon thread; None where the C library has no malloc_trim. Without it an arena keeps the
    pages of its highest peak of live buffers, so RSS steps up with each new peak."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = (ctypes.c_size_t,)

    def run() -> None:
        while True:
            time.sleep(interval_s)
            trim(0)

    thread = threading.Thread(target=run, name="npucam-malloc-trim", daemon=True)
    thread.start()
    return thread
