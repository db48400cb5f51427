"""The npucam process runs with glibc capped at 2 malloc arenas and their free pages handed
back every 10 s (pipeline/entry.py, pipeline/memory.py): its threads share the arenas, and an
arena does not keep the pages of its highest peak, so RSS does not step up with each new peak
(the soak's RSS gate, docs/benchmarks.md).

`npucam run` (a subprocess) with four cameras, whose reader threads and the executor's workers
all allocate frame-sized buffers, reports its arenas from malloc_info(3) when it stops
(tests/reliability/fault_stages.py:Arenas). Before the fix glibc gave each allocating thread
its own (8 or more here); now there are 2. MALLOC_ARENA_MAX in the environment still wins.
"""

from __future__ import annotations

import json
import platform
import signal
import time
from pathlib import Path

import pytest
from rel_helpers import NpucamRun

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")


def arenas_of_a_run(write_config, tmp_path, env: dict) -> dict:
    cams = "".join(
        f'[[cameras]]\nname = "c{i}"\nurl = "synthetic:?width=640&height=480&fps=30"\n'
        for i in range(4)
    )
    report = tmp_path / "arenas.txt"
    path = write_config(
        cams
        + f"""
[[stages]]
kind = "capture"
[[stages]]
kind = "fault_stages:Arenas"
report = "{report}"
inbox = {{ size = 8, policy = "drop_oldest" }}
"""
    )
    run = NpucamRun(path, env={"PYTHONPATH": str(Path(__file__).parent), **env})
    try:
        time.sleep(4.0)
        run.signal(signal.SIGTERM)
        code, err = run.wait()
    finally:
        run.kill()
    assert code == 0, err
    return json.loads(report.read_text())


def test_npucam_threads_share_two_malloc_arenas(write_config, tmp_path, monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    report = arenas_of_a_run(write_config, tmp_path, {})
    print(f"\nmalloc arenas of npucam run: {report['arenas']}")
    assert report["arenas"] == 2
    assert "npucam-malloc-trim" in report["threads"]


def test_malloc_arena_max_in_the_environment_wins(write_config, tmp_path):
    assert arenas_of_a_run(write_config, tmp_path, {"MALLOC_ARENA_MAX": "3"})["arenas"] == 3
