"""Clock jumps on a camera (issue 18, finding 3): one `zmq:` frame stamped a day ahead used to
stop that camera's detections for good (the tracker refused every later frame as "before the
previous frame") while its health stayed `online`. Now a received grab time further than
max_clock_skew_ms from the arrival time is re-stamped on arrival (counted in the camera's
clock_skews, logged), and a frame time that goes back within that skew is a clock jump the
tracker absorbs (detect's clock_jumps gauge): every frame keeps its detections and its
person keeps its track id."""

from __future__ import annotations

import asyncio

import numpy as np
from rel_helpers import pushed_run

from pipeline.messages import Frame, now_ns
from stages.frame_wire import encode_frame

DAY_NS = 86_400 * 10**9


def test_a_frame_a_day_ahead_or_seconds_back_never_stops_a_cameras_detections(
    write_config, free_port
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = write_config(
        f"""
        [metrics]
        stats_interval_s = 0.2
        [[cameras]]
        name = "remote"
        url = "zmq:{endpoint}"
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "detect"
        person = "roi"
        person_regions = [{{ name = "door", x = 8, y = 8, w = 24, h = 32 }}]
        face = "none"
        pose = false
        inbox = {{ size = 64, policy = "block" }}
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        inbox = {{ size = 64, policy = "block" }}
        """
    )
    image = np.full((48, 64, 3), 90, np.uint8)
    # grab-time offsets from the sender's "now": 10 normal frames, one a day ahead, 10
    # normal, one 3 s back (within max_clock_skew_ms: kept, a jump for the tracker), 10 more
    offsets = [0] * 10 + [DAY_NS] + [0] * 10 + [-3 * 10**9] + [0] * 10

    async def main():
        async with pushed_run(path, endpoint) as run:
            rec = run.rec
            await asyncio.sleep(0.3)
            for seq, offset in enumerate(offsets):
                t = now_ns() + offset
                msg = encode_frame(Frame("remote", seq, t, t + 10**9, image, "test"), "raw")
                await asyncio.to_thread(run.push.send_multipart, msg)
                await asyncio.sleep(0.02)
            await rec.wait_for(
                lambda: len(rec.frames("remote")) >= len(offsets), 10, "every frame's det"
            )
            await asyncio.sleep(0.5)
            last = rec.stats()[-1].header["stats"]
            drops = run.pipeline.metrics.dropped("detect")
        return run.code, rec, last, drops

    code, rec, last, drops = asyncio.run(main())
    assert code == 0
    dets = [s.header for s in rec.frames("remote")]
    assert [h["seq"] for h in dets] == list(range(len(offsets)))
    assert all(h["track_ids"] == [1] for h in dets), [h["track_ids"] for h in dets]
    assert drops == 0  # no frame failed in detect
    camera = last["cameras"]["remote"]
    assert camera["clock_skews"] == 1 and "re-stamped on arrival" in camera["last_error"]
    assert camera["health"] == "online"
    ahead = dets[10]
    assert abs(ahead["capture_ts"] - dets[9]["capture_ts"]) < 5 * 10**9  # re-stamped
    assert last["stages"]["detect"]["gauges"]["clock_jumps"] == 1
