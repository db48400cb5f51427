"""pipeline/memory.py: the malloc arena cap, checked in fresh interpreters (it is process-wide)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from pipeline.memory import cap_malloc_arenas as c; print(c())"


def run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env_extra
    return subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's arena cap is glibc's")
def test_the_cap_is_set_on_glibc_unless_the_environment_sets_one():
    assert run({}) == "True"
    assert run({"MALLOC_ARENA_MAX": "4"}) == "False"


def test_a_cap_below_one_is_refused():
    from pipeline.memory import cap_malloc_arenas

    with pytest.raises(ValueError, match="arenas must be >= 1"):
        cap_malloc_arenas(0)


TRIM = """
import threading, time
import numpy as np
from pipeline.memory import start_trimming
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
def churn():  # frame-sized buffers in a thread's arena, freed again but for a few
    np.ones(4_000_000).sum()  # freeing a 32 MB block raises the mmap threshold above it
    keep = [np.ones(s) for s in range(100_000, 400_000, 1000)]
    pinned = keep[::50]  # live blocks between the freed ones: no trim at the arena's top
    del keep
    return pinned
held = []
t = threading.Thread(target=lambda: held.append(churn())); t.start(); t.join()
before = rss()
start_trimming(0.1)
time.sleep(0.5)
print(before, rss())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trimming_hands_an_arenas_free_pages_back():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", TRIM], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    before, after = int(out[0]), int(out[1])
    assert after < before - 100, (before, after)  # MB: the freed buffers' pages went back


FAULTS = """
import resource, sys, threading
import numpy as np
if sys.argv[1] == "fixed":
    from pipeline.memory import fix_malloc_thresholds
    assert fix_malloc_thresholds()
def cycle():  # three 1080p frames alive, freed newest first: two free ones at the arena top
    frames = [np.empty(1920 * 1080 * 3, np.uint8) for _ in range(3)]
    for f in frames:
        f[::4096] = 1  # touch every page, as a receive into it does
    while frames:
        frames.pop()
def faults_per_frame():
    for _ in range(3):
        cycle()  # warm-up: glibc's own thresholds rise to the frame size here
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        cycle()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 60
main = faults_per_frame()
out = []
t = threading.Thread(target=lambda: out.append(faults_per_frame())); t.start(); t.join()
print(main, out[0])
"""


def faults(mode: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUN"))}
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, mode], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return [float(x) for x in out]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")
def test_fixed_thresholds_keep_freed_frames_pages_for_the_next_frames():
    # A 1080p frame is 1519 pages. glibc's moving trim threshold hands two free frames at the
    # main arena's top back on free, so a third of the frames are fresh pages.
    assert faults("moving")[0] > 300
    assert max(faults("fixed")) < 5  # main arena and a thread's: the pages stay for reuse


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")
def test_the_environments_malloc_thresholds_win():
    code = "from pipeline.memory import fix_malloc_thresholds as f; print(f())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    for extra in ({"MALLOC_TRIM_THRESHOLD_": "1000000"},
                  {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1000000"}):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", code], env=env | extra, capture_output=True, text=True
        )
        assert out.stdout.strip() == "False", (extra, out.stderr)
