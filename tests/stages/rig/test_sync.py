"""Frame grouping by capture time (stages/rig/sync.py), driven by a fake clock: frames reach
the grouper in arrival order, 0-15 ms after capture, and the clock reads the arrival time.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from stages.rig.sync import FrameGroup, FrameGrouper, SyncError

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def run(
    fps: dict[str, float],
    offsets_ms: dict[str, float],
    seconds: float,
    seed: int = 0,
    drop: set[tuple[str, int]] = frozenset(),
    **kwargs,
):
    """Capture every camera for `seconds`; deliver each frame 0-15 ms late, in arrival order;
    returns (grouper, groups, frames sent)."""
    rng = np.random.default_rng(seed)
    frames = []
    for cam, rate in fps.items():
        for seq in range(int(seconds * rate)):
            if (cam, seq) in drop:
                continue
            ts = round((offsets_ms[cam] + 1000 * seq / rate) * MS)
            frames.append((ts + int(rng.uniform(0, 15) * MS), cam, seq, ts))
    frames.sort()
    clock = Clock()
    grouper = FrameGrouper(fps, clock=clock, **kwargs)
    groups: list[FrameGroup] = []
    for arrival, cam, seq, ts in frames:
        clock.now = arrival
        groups += grouper.expire()
        groups += grouper.add(cam, seq, ts)
    groups += grouper.flush()
    return grouper, groups, frames


RATES = {"a": 25.0, "b": 30.0, "c": 29.97}
OFFSETS = {"a": 0.0, "b": 7.0, "c": 13.0}


def test_mixed_rates_group_within_half_a_frame_period():
    grouper, groups, frames = run(RATES, OFFSETS, seconds=10)
    half_period = 0.5e9 / 30
    assert grouper.tolerance_ns == round(half_period)
    assert max(g.skew_ns for g in groups) <= half_period
    # every frame lands in exactly one group; groups come out in capture order
    placed = sorted((v.camera, v.seq) for g in groups for v in g.views.values())
    assert placed == sorted((cam, seq) for _, cam, seq, _ in frames) and grouper.late == 0
    assert all(a.first_ts < b.first_ts for a, b in pairwise(groups))
    # grouping is maximal: no two groups with disjoint cameras would still fit together
    for i, a in enumerate(groups):
        for b in groups[i + 1 : i + 4]:
            if not set(a.views) & set(b.views):
                assert max(a.last_ts, b.last_ts) - min(a.first_ts, b.first_ts) > half_period
    complete = sum(not g.missing for g in groups)
    assert complete > 0.6 * 250  # a 25 fps camera pairs with the 30 fps ones most of the time


def test_equal_rates_with_offsets_under_the_tolerance_always_group_whole():
    fps = {"a": 30.0, "b": 30.0, "c": 30.0}
    _, groups, _ = run(fps, {"a": 0.0, "b": 6.0, "c": 12.0}, seconds=5, seed=1)
    assert len(groups) == 150 and all(not g.missing and len(g.views) == 3 for g in groups)
    assert all(g.skew_ns == 12 * MS for g in groups)
    assert all(g.capture_ts == g.views["b"].capture_ts for g in groups)  # the mean instant


def test_a_dropped_view_degrades_to_the_remaining_ones():
    fps = {"a": 30.0, "b": 30.0, "c": 30.0}
    _, groups, _ = run(fps, {"a": 0.0, "b": 6.0, "c": 12.0}, seconds=2, drop={("b", 20)})
    assert len(groups) == 60
    (short,) = [g for g in groups if g.missing]
    assert short.missing == ("b",) and sorted(short.views) == ["a", "c"]
    assert short.views["a"].seq == 20


def test_a_silent_camera_times_out_after_the_wait():
    clock = Clock()
    grouper = FrameGrouper({"a": 30.0, "b": 30.0}, clock=clock)
    assert grouper.wait_ns == round(2e9 / 30)
    assert grouper.add("a", 0, 0) == []
    assert grouper.next_deadline() == grouper.wait_ns
    clock.now = grouper.wait_ns - 1
    assert grouper.expire() == []
    clock.now = grouper.wait_ns
    (group,) = grouper.expire()
    assert group.missing == ("b",) and list(group.views) == ["a"]


def test_a_view_after_its_group_left_is_dropped_as_late():
    clock = Clock()
    grouper = FrameGrouper({"a": 30.0, "b": 30.0}, clock=clock)
    grouper.add("a", 0, 0)
    clock.now = 100 * MS
    assert len(grouper.expire()) == 1
    assert grouper.add("b", 0, 5 * MS) == [] and grouper.late == 1
    assert grouper.flush() == []


def test_open_groups_are_bounded():
    grouper = FrameGrouper({"a": 30.0, "b": 30.0}, max_open=4, clock=Clock())
    out = []
    for seq in range(10):  # camera b silent, the clock never moves: only the bound closes
        out += grouper.add("a", seq, seq * 33 * MS)
    assert [g.views["a"].seq for g in out] == list(range(6))
    assert len(grouper.flush()) == 4


def test_unknown_camera_and_bad_rates_are_refused():
    grouper = FrameGrouper({"a": 30.0}, clock=Clock())
    with pytest.raises(SyncError, match="camera 'z' is not in the rig"):
        grouper.add("z", 0, 0)
    with pytest.raises(SyncError, match="camera 'b': fps must be a positive number"):
        FrameGrouper({"a": 30.0, "b": 0.0})


def test_place_returns_the_group_a_frame_joined_numbered_in_opening_order():
    clock = Clock()
    grouper = FrameGrouper({"a": 30.0, "b": 30.0}, clock=clock)
    first, closed = grouper.place("a", 0, 0)
    assert closed == [] and first.id == 0 and list(first.views) == ["a"]
    joined, closed = grouper.place("b", 0, 5 * MS)
    assert joined is first and closed == [first] and not first.missing  # complete: it closes
    second, _ = grouper.place("a", 1, 33 * MS)
    assert second.id == 1
    clock.now = 200 * MS
    assert grouper.expire() == [second]
    late, closed = grouper.place("b", 1, 30 * MS)  # its group has left
    assert late is None and closed == [] and grouper.late == 1
