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
