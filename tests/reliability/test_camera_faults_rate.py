"""How a fault on one camera of a live two-camera pipeline touches the other's stream, and how
long the faulty camera takes to come back, measured against a control run of the same rig
(tests/reliability/camera_rig.py) made just before: `slow`, because rates, silences and
recovery times on the wall clock are this host's speed (docs/architecture.md, "Testing").

Bounds, each relative to the control: during the other camera's stall and its time off the
network, the steady camera keeps at least RATE_SHARE of its control rate, and its longest
silence stays under its control silence plus the stall timeout (a reader held up by the other
camera's fault would cost at least that); the faulty camera is back within one backoff wait at
the cap, the stall timeout and two cold opens of the same stream (cv2.VideoCapture, timed
here). The behaviour itself is test_camera_faults.py's. Run: `pytest -s -m slow THIS_FILE`;
the numbers are in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import time

import cv2
import pytest
from camera_rig import (
    HANG_S,
    RECONNECT_MAX_S,
    STALL_TIMEOUT_S,
    health_changes,
    live_rig,
    recovered,
)
from rel_helpers import Recorder

from pipeline.messages import now_ns

pytestmark = pytest.mark.slow

RATE_SHARE = 0.7
WINDOW_S = 3.0  # the control window, and how long the camera stays off the network


def stream_of(rec: Recorder, camera: str, t0_ns: int, t1_ns: int) -> tuple[float, float]:
    """(frames a second, longest silence in s) of camera's frames arriving in [t0, t1]."""
    times = [s.received_ns for s in rec.frames(camera) if t0_ns <= s.received_ns <= t1_ns]
    edges = [t0_ns, *times, t1_ns]
    gap = max(b - a for a, b in zip(edges, edges[1:], strict=False)) / 1e9
    return len(times) / ((t1_ns - t0_ns) / 1e9), gap


def cold_open_s(url: str) -> float:
    """Seconds to open the stream and read its first frame, as the reader's open does."""
    t0 = time.monotonic()
    cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG)
    try:
        ok, _ = cap.read()
        assert ok, url
    finally:
        cap.release()
    return time.monotonic() - t0


def test_a_faulty_camera_leaves_the_other_at_rate_and_comes_back_promptly(write_config):
    async def main() -> dict[str, tuple]:
        async with live_rig(write_config) as (faulty, steady, _pipeline, rec):
            opens = [await asyncio.to_thread(cold_open_s, steady.url) for _ in range(3)]
            t0 = now_ns()
            await asyncio.sleep(WINDOW_S)
            out: dict[str, tuple] = {"control": (*stream_of(rec, "steady", t0, now_ns()), None)}

            t_fault = now_ns()
            faulty.stall()
            await rec.wait_for(
                lambda: health_changes(rec, "faulty", t_fault)[-1:] == ["reconnecting"],
                HANG_S,
                "faulty reconnecting after its stall",
            )
            t_back = now_ns()
            faulty.resume()
            recovery = await recovered(rec, "faulty", t_back)
            out["stall"] = (*stream_of(rec, "steady", t_fault, now_ns()), recovery)

            t_fault = now_ns()
            await asyncio.to_thread(faulty.down)
            await asyncio.sleep(WINDOW_S)
            t_back = now_ns()
            await asyncio.to_thread(faulty.up)
            recovery = await recovered(rec, "faulty", t_back)
            out["down/up"] = (*stream_of(rec, "steady", t_fault, now_ns()), recovery)
        out["cold open"] = (min(opens),)
        return out

    got = asyncio.run(main())
    rate_c, gap_c, _ = got["control"]
    (open_s,) = got["cold open"]
    recovery_bound = RECONNECT_MAX_S + STALL_TIMEOUT_S + 2 * open_s
    print(
        f"\nsteady control: {rate_c:.1f} fps, longest silence {gap_c:.3f} s; "
        f"cold open {open_s:.3f} s"
    )
    for fault in ("stall", "down/up"):
        rate, gap, recovery = got[fault]
        print(
            f"{fault}: steady {rate:.1f} fps ({rate / rate_c:.2f} of control), longest silence "
            f"{gap:.3f} s; faulty back in {recovery:.3f} s (bound {recovery_bound:.3f} s)"
        )
    for fault in ("stall", "down/up"):
        rate, gap, recovery = got[fault]
        assert rate >= RATE_SHARE * rate_c, (fault, rate, rate_c)
        assert gap < gap_c + STALL_TIMEOUT_S, (fault, gap, gap_c)
        assert 0 < recovery <= recovery_bound, (fault, recovery, recovery_bound)
