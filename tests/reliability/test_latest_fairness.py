"""A `latest` inbox shared by many cameras serves them in turn (pipeline/queues.py).

Sixteen equal synthetic cameras at 25 fps feed one slow stage (10 ms a frame, so it takes
about a quarter of what they send) through a `latest` inbox of size 2, as the detect stage
of configs/demo.toml is fed. Counted over the steady state (from 1 s after the last camera's
first frame to 0.5 s before the end), every camera gets about the same number of results:
max/min <= 1.5, and none waits long between two. Before the fix a replaced item moved to the
back of the line and a full queue evicted whatever was oldest, so cameras whose frames arrived
just before each get were starved (6 to 235 results in 10 s).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from engine_stages import start

CAMERAS = [f"c{i:02d}" for i in range(16)]


def config_text(size: int) -> str:
    cams = "".join(
        f"""
        [[cameras]]
        name = "{name}"
        url = "synthetic:?width=32&height=24&fps=25"
        """
        for name in CAMERAS
    )
    return f"""
        [metrics]
        stats_interval_s = 0
        {cams}
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "slow"
        kind = "engine_stages:Slow"
        delay_s = 0.01
        inbox = {{ size = {size}, policy = "latest" }}
        [[stages]]
        name = "collect"
        kind = "engine_stages:Collect"
        inbox = {{ size = 10000, policy = "block" }}
    """


def results_per_camera(write_config, seconds: float, size: int) -> tuple[list[int], float, int]:
    """(results per camera in the steady state, the longest wait between two results of one
    camera in s, the most results of other cameras between two of one camera)."""
    path = write_config(config_text(size))

    async def main():
        pipeline, task = await start(path, duration=seconds)
        assert await task == 0
        return pipeline.stages["collect"].items

    items = asyncio.run(main())
    first = {}
    for item in items:
        first.setdefault(item.camera, item.capture_ts_ns)
    assert sorted(first) == CAMERAS, "every camera delivered"
    t0 = max(first.values()) + 1_000_000_000
    t1 = max(item.capture_ts_ns for item in items) - 500_000_000
    steady = [item for item in items if t0 <= item.capture_ts_ns <= t1]
    counts = Counter(item.camera for item in steady)
    longest = 0.0
    skipped = 0
    for cam in CAMERAS:
        ts = [item.capture_ts_ns for item in steady if item.camera == cam]
        longest = max([longest, *((b - a) / 1e9 for a, b in zip(ts, ts[1:], strict=False))])
        turns = [i for i, item in enumerate(steady) if item.camera == cam]  # in delivery order
        skipped = max([skipped, *(b - a - 1 for a, b in zip(turns, turns[1:], strict=False))])
    return [counts[cam] for cam in CAMERAS], longest, skipped


def check_fair(
    counts: list[int], longest: float, skipped: int, seconds: float, slow: bool = False
) -> None:
    print(
        f"\n16 cameras, {seconds:g} s: results per camera min {min(counts)} max {max(counts)} "
        f"(max/min {max(counts) / max(1, min(counts)):.2f}); longest wait {longest:.2f} s, "
        f"at most {skipped} results of other cameras between two of one"
    )
    assert min(counts) > 0
    assert max(counts) / min(counts) <= 1.5, counts
    # Round-robin over 16 cameras: 15 others between two turns of one, a few more where a
    # camera had no frame waiting at its turn (~0.16 s a turn at ~100 results/s on an idle
    # host; the wait in seconds is the host's speed, printed, not asserted)
    assert skipped <= 3 * 16, skipped
    if slow:  # the turn's time on the wall clock: the slow run's, the issue 27 way
        assert longest < 1.0


def test_latest_inbox_serves_16_equal_cameras_in_turn(write_config):
    seconds = 8.0
    check_fair(*results_per_camera(write_config, seconds, size=2), seconds)


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 16])
def test_latest_inbox_serves_16_equal_cameras_in_turn_for_a_minute(write_config, size):
    seconds = 60.0
    check_fair(*results_per_camera(write_config, seconds, size=size), seconds, slow=True)
