"""npu/rows.py: how many host-glue threads a process takes, and RowPool covering every row
exactly once whatever its thread count."""

from __future__ import annotations

import os

import pytest

from npu.rows import MAX_THREADS, THREADS_ENV, RowPool, host_threads


@pytest.mark.parametrize(("cpus", "want"), [(1, 1), (2, 1), (3, 1), (8, 4), (64, MAX_THREADS)])
def test_the_default_is_half_the_cpus_this_process_may_use(monkeypatch, cpus, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert host_threads({}) == want


@pytest.mark.parametrize(("raw", "want"), [("3", 3), ("99", MAX_THREADS), ("0", 1), ("x", 1)])
def test_the_environment_overrides_it_when_it_is_a_positive_int(monkeypatch, raw, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert host_threads({THREADS_ENV: raw}) == want


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_pool_runs_each_chunk_once(threads):
    pool = RowPool(threads)
    seen = []
    pool.run(103, 10, lambda r0, r1: seen.append((r0, r1)))
    assert sorted(seen) == [(r, min(r + 10, 103)) for r in range(0, 103, 10)]
