"""Camera faults on a live two-camera pipeline: one HTTP MJPEG camera stalls, drops off the
network and comes back, sends corrupt frames and changes its frame size, while the other
keeps streaming. Proven: the faulty camera reconnects with backoff, its health shows on the
`stats` topic (stale, reconnecting, online), it publishes again after the fault, and the other
camera keeps publishing through the faulty one's outage, in order, online, never reconnected,
with every frame it lost counted as a drop.

Behaviour only: how fast the other camera streams during a fault (against a control window)
and how long a recovery takes are measured by the slow test_camera_faults_rate.py, and
printed there for docs/reliability.md. The rig is tests/reliability/camera_rig.py.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from camera_rig import (
    BEFORE_NS,
    HANG_S,
    RECONNECT_MAX_S,
    RECONNECT_MIN_S,
    camera_stats,
    first_frame_after,
    health_changes,
    live_rig,
    outage,
    recovered,
)
from rel_helpers import Recorder, seq_gaps

from pipeline.messages import now_ns


def assert_kept_streaming(rec: Recorder, camera: str, t0_ns: int, t1_ns: int) -> None:
    """camera published while [t0_ns, t1_ns] (another camera's fault) lasted, in seq order,
    every seq it skipped counted as a publish drop, online throughout, never reconnected."""
    seqs = [s.header["seq"] for s in rec.frames(camera) if t0_ns <= s.received_ns <= t1_ns]
    assert seqs, f"{camera}: nothing published during the other camera's fault"
    assert seqs == sorted(set(seqs))
    stats = camera_stats(rec, camera, t0_ns)
    drops = rec.stats()[-1].header["stats"]["stages"]["publish"]["drops"].get(camera, {})
    assert seq_gaps(seqs) <= sum(drops.values()), (camera, seq_gaps(seqs), drops)
    assert {st["health"] for st in stats} == {"online"}
    assert stats[-1]["reconnects"] == stats[0]["reconnects"] == 0


def test_stalled_camera_goes_stale_reconnects_and_recovers_others_unaffected(write_config):
    async def main():
        async with live_rig(write_config) as (faulty, _steady, _pipeline, rec):
            t_fault = now_ns()
            faulty.stall()
            await rec.wait_for(
                lambda: "stale" in health_changes(rec, "faulty", t_fault), HANG_S, "faulty stale"
            )
            await rec.wait_for(
                lambda: health_changes(rec, "faulty", t_fault)[-1] == "reconnecting",
                HANG_S,
                "faulty reconnecting after stale",
            )
            t_back = now_ns()
            faulty.resume()
            recovery = await recovered(rec, "faulty", t_back)
            down, up = outage(rec, "faulty", t_fault)
            assert_kept_streaming(rec, "steady", down, up)
            changes = health_changes(rec, "faulty", t_fault - BEFORE_NS)
            reconnects = camera_stats(rec, "faulty")[-1]["reconnects"]
        return recovery, changes, reconnects

    recovery, changes, reconnects = asyncio.run(main())
    print(f"\nRECOVERY stall: {recovery:.3f} s (health {' -> '.join(changes)})")
    assert changes[0] == "online" and changes[-1] == "online"
    assert changes.index("stale") < changes.index("reconnecting")
    assert reconnects >= 1
    assert recovery > 0  # its first frame after the fault was published after the server resumed


def max_attempts(window_s: float) -> int:
    """Reopen attempts a camera can make in window_s under the backoff schedule, with every
    wait at its shortest (jitter 0.5) and opens taking no time."""
    t, attempts = 0.0, 1
    while True:
        t += 0.5 * min(RECONNECT_MAX_S, RECONNECT_MIN_S * 2 ** (attempts - 1))
        if t > window_s:
            return attempts
        attempts += 1


def test_camera_that_drops_off_reconnects_with_backoff_and_recovers(write_config):
    down_s = 3.0

    async def main():
        async with live_rig(write_config) as (faulty, _steady, _pipeline, rec):
            t_fault = now_ns()
            await asyncio.to_thread(faulty.down)
            await rec.wait_for(
                lambda: "reconnecting" in health_changes(rec, "faulty", t_fault),
                HANG_S,
                "faulty reconnecting",
            )
            t_first = time.monotonic()
            before = camera_stats(rec, "faulty")[-1]["reconnects"]
            await asyncio.sleep(down_s)
            after = camera_stats(rec, "faulty")[-1]["reconnects"]
            window = time.monotonic() - t_first
            t_back = now_ns()
            await asyncio.to_thread(faulty.up)
            recovery = await recovered(rec, "faulty", t_back)
            down, up = outage(rec, "faulty", t_fault)
            assert_kept_streaming(rec, "steady", down, up)
            changes = health_changes(rec, "faulty", t_fault - BEFORE_NS)
        return recovery, after - before, window, changes

    recovery, attempts, window, changes = asyncio.run(main())
    bound = max_attempts(window)
    # Without backoff (every wait at reconnect_min_s) the camera would try window / 0.05 times.
    print(
        f"\nRECOVERY down/up: {recovery:.3f} s; {attempts} reopen attempts in {window:.2f} s "
        f"(backoff bound {bound}, no-backoff {math.floor(window / (0.5 * RECONNECT_MIN_S))})"
    )
    # wall-clock-ok: a count against the backoff schedule over the window it was counted in (a
    # slower host makes fewer attempts in it, never more); 2 is what 3 s of retrying gives at
    # the slowest schedule (0.8 s waits) with a whole second to spare
    assert 2 <= attempts <= bound
    assert changes[0] == "online" and "reconnecting" in changes and changes[-1] == "online"
    assert recovery > 0


def test_corrupt_frames_are_counted_and_skipped_without_a_reconnect(write_config):
    bad_wanted = 6  # one card in 4 is garbage: 6 bad ones come with about 18 good ones

    async def main():
        async with live_rig(write_config) as (faulty, _steady, _pipeline, rec):
            t_fault = now_ns()
            start_stats = camera_stats(rec, "faulty")[-1]
            faulty.corrupt_every = 4
            await rec.wait_for(
                lambda: (
                    camera_stats(rec, "faulty")[-1]["bad_frames"]
                    >= start_stats["bad_frames"] + bad_wanted
                ),
                HANG_S,
                f"{bad_wanted} bad frames counted",
            )
            faulty.corrupt_every = 0
            t_clean = now_ns()
            # A frame grabbed after the garbage stopped has been published, so every frame
            # grabbed before it has been too (a camera's frames are published in order).
            await rec.wait_for(
                lambda: first_frame_after(rec, "faulty", t_clean) is not None,
                HANG_S,
                "a frame after the corruption",
            )
            t_end = now_ns()
            end_stats = camera_stats(rec, "faulty")[-1]
            got = [
                s.header["seq"]
                for s in rec.frames("faulty")
                if t_fault <= s.header["capture_ts"] <= t_clean
            ]
            assert_kept_streaming(rec, "steady", t_fault, t_end)
            changes = health_changes(rec, "faulty", t_fault)
        return start_stats, end_stats, got, changes

    start_stats, end_stats, got, changes = asyncio.run(main())
    bad = end_stats["bad_frames"] - start_stats["bad_frames"]
    grabbed = len(got) + seq_gaps(got)  # seqs are given to the frames that decode
    print(f"\nCORRUPT: {bad} bad frames counted, {grabbed} good frames grabbed meanwhile")
    assert bad >= bad_wanted
    # The 3 in 4 that decode kept flowing between the garbage: more good frames than bad.
    assert grabbed >= bad
    assert end_stats["reconnects"] == start_stats["reconnects"]
    assert changes == ["online"]
    assert got == sorted(set(got))


def test_resized_frames_show_after_a_reopen_and_are_counted(write_config):
    frames_after = 5

    async def main():
        async with live_rig(write_config) as (faulty, _steady, _pipeline, rec):
            t_fault = now_ns()
            faulty.width, faulty.height = 320, 240
            # The open stream keeps delivering its opening size (FFmpeg scales the new cards).
            await rec.wait_for(
                lambda: len([s for s in rec.frames("faulty") if s.received_ns > t_fault]) >= 10,
                HANG_S,
                "frames of the resized cards on the open stream",
            )
            t_reopen = now_ns()
            await asyncio.to_thread(faulty.down)
            await rec.wait_for(
                lambda: "reconnecting" in health_changes(rec, "faulty", t_reopen),
                HANG_S,
                "faulty reconnecting",
            )
            t_back = now_ns()
            await asyncio.to_thread(faulty.up)
            recovery = await recovered(rec, "faulty", t_back)
            await rec.wait_for(
                lambda: (
                    len([s for s in rec.frames("faulty") if s.header["capture_ts"] > t_back])
                    >= frames_after
                ),
                HANG_S,
                f"{frames_after} frames after the reopen",
            )
            t_end = now_ns()
            assert_kept_streaming(rec, "steady", t_fault, t_end)
            sizes_before = {
                (s.header["width"], s.header["height"])
                for s in rec.frames("faulty")
                if t_fault <= s.header["capture_ts"] <= t_reopen
            }
            after = [s for s in rec.frames("faulty") if s.header["capture_ts"] > t_back]
            sizes_after = {(s.header["width"], s.header["height"]) for s in after}
            size_changes = camera_stats(rec, "faulty")[-1]["size_changes"]
        return recovery, sizes_before, sizes_after, size_changes

    recovery, before, after, size_changes = asyncio.run(main())
    print(f"\nRECOVERY resize+reopen: {recovery:.3f} s; sizes {before} -> {after}")
    # The open stream keeps its opening size (FFmpeg scales), frames keep flowing meanwhile;
    # the reopened stream delivers the new size, and the change is counted.
    assert before == {(160, 120)}
    assert after == {(320, 240)}
    assert size_changes == 1
    assert recovery > 0


if __name__ == "__main__":
    pytest.main([__file__, "-s", "-q"])
