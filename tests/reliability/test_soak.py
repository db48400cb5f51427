"""The 2-minute soak (bench/soak.py; `make soak` runs 30 minutes): four looping cameras
through detect, align, infer on the simulated NPU, postprocess and publish, with RSS growth
after warm-up within 5%, no fd, asyncio-task or thread leak, and every result kind
published. Slow: run with -m slow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from soak import soak  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_minute_soak_on_sim_has_no_leaks():
    # RSS rises for ~100 s on this path (bench/soak.py): 90 s of warm-up, 30 s observed.
    result = soak(120, path="sim", warmup_s=90, sample_s=3)
    print(
        f"\nSOAK checks: {result.checks}\nSOAK topics: {result.topics}\nSOAK drops: {result.drops}"
    )
    assert result.exit_code == 0
    assert result.ok, result.failures
    # pose is not required: on a loaded 2-core machine every synthetic Sapiens2 job can be
    # dropped npu_busy (it cannot finish before its deadline), which is correct behaviour.
    for topic in ("det", "face", "clip", "stats"):
        assert result.topics.get(topic, 0) > 0, (topic, result.topics)
