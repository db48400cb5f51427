"""glibc malloc settings for a long-running stream: its arenas capped at DEFAULT_ARENAS.

glibc gives each thread that allocates its own arena, up to 8 per core (16 on a 2-core host),
and raises its mmap threshold to the largest block freed (up to 32 MiB), so after the first
frames the frame- and batch-sized numpy buffers come from the arenas, not from mmap, and each
arena keeps the free blocks of its own peak. In a 6-minute sim soak (bench/soak.py) malloc_info
showed 16 arenas holding 298 MB, 183 MB of it free, and RSS stepping up whenever a thread
reached a new peak in its arena (+5.5% after warm-up: the 5% gate failed); with 2 arenas,
157 MB held, 49 MB free, RSS +0.35% (docs/benchmarks.md). A fixed mmap threshold (1 MiB) kept
RSS flat too, but every frame-sized buffer was then fresh pages: 4 ms instead of 0.6 ms to
copy and convert one 1280x720 frame. MALLOC_ARENA_MAX in the environment, which glibc reads at
startup, takes precedence; other C libraries are left alone. Called by pipeline/entry.py only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

DEFAULT_ARENAS = 2
M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def cap_malloc_arenas(arenas: int = DEFAULT_ARENAS) -> bool:
    """Limit glibc to `arenas` malloc arenas from now on, unless MALLOC_ARENA_MAX is set.

    Call it before the worker threads start. Returns True if the cap was set (False: the
    environment sets one, or the C library has no mallopt, or refused it)."""
    if arenas < 1:
        raise ValueError(f"arenas must be >= 1, got {arenas}")
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = mallopt(M_ARENA_MAX, arenas) == 1
    log.debug("malloc arenas capped at %d: %s", arenas, ok)
    return ok
