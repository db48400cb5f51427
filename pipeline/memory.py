"""Process memory settings for a long-running stream: a cap on glibc's malloc arenas.

glibc gives a thread that allocates while another holds an arena its own arena (up to 8 per
core), and memory freed into one arena is never reused by a thread of another. With numpy's
large short-lived buffers spread over the stages' worker threads, RSS then steps up each time
another worker starts allocating: +16 MB when the 4th of the sim soak's workers started
400 s into a run (bench/soak.py, docs/benchmarks.md), and it does not come back. Capping the
arenas makes threads share them. MALLOC_ARENA_MAX in the environment, which glibc reads at
startup, takes precedence; other C libraries are left alone.
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
