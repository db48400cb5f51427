"""A live two-camera rig for the camera-fault tests: two tests/stages/mjpeg_server.py cameras
on 127.0.0.1 ("faulty", "steady"), the npucam engine (capture -> publish) run in-process from
a config written here, and a subscriber recording det/<camera> and stats. Shared by
test_camera_faults.py (behaviour) and test_camera_faults_rate.py (slow: rates against a
control window)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from engine_stages import start
from mjpeg_server import MjpegServer
from rel_helpers import Recorder, Seen

FPS = 25.0
STALL_TIMEOUT_S = 1.0
RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 0.8
HANG_S = 20.0  # a hang guard on every wait: the waits end as soon as what they wait for holds
# Health sequences start this long before a fault, so they show the state it interrupted.
BEFORE_NS = 200_000_000


def config_text(faulty: MjpegServer, steady: MjpegServer) -> str:
    camera = f"""
        stall_timeout_s = {STALL_TIMEOUT_S}
        reconnect_min_s = {RECONNECT_MIN_S}
        reconnect_max_s = {RECONNECT_MAX_S}
        staleness_ms = 5000
    """
    return f"""
        [metrics]
        stats_interval_s = 0.05
        [[cameras]]
        name = "faulty"
        url = "{faulty.url}"
        {camera}
        [[cameras]]
        name = "steady"
        url = "{steady.url}"
        {camera}
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        inbox = {{ size = 16, policy = "drop_oldest" }}
    """


@contextlib.asynccontextmanager
async def live_rig(
    write_config: Callable[[str], Path],
) -> AsyncIterator[tuple[MjpegServer, MjpegServer, object, Recorder]]:
    """(faulty server, steady server, pipeline, recorder) with both cameras streaming."""
    with MjpegServer(fps=FPS) as faulty, MjpegServer(fps=FPS) as steady:
        pipeline, task = await start(write_config(config_text(faulty, steady)))
        try:
            await asyncio.wait_for(pipeline.stages["publish"].bound.wait(), HANG_S)
            rec = await Recorder(pipeline.stages["publish"].endpoint).start()
            await rec.wait_for(
                lambda: len(rec.frames("faulty")) >= 10 and len(rec.frames("steady")) >= 10,
                HANG_S,
                "both cameras streaming",
            )
            yield faulty, steady, pipeline, rec
        finally:
            pipeline.stop()
            assert await asyncio.wait_for(task, HANG_S) == 0
            await rec.stop(idle_s=0.05)


def camera_stats(rec: Recorder, camera: str, after_ns: int = 0) -> list[dict]:
    """The camera's entry of every stats message published after after_ns."""
    return [
        s.header["stats"]["cameras"][camera]
        for s in rec.stats()
        if s.header["publish_ts"] > after_ns and camera in s.header["stats"]["cameras"]
    ]


def health_changes(rec: Recorder, camera: str, after_ns: int = 0) -> list[str]:
    out: list[str] = []
    for st in camera_stats(rec, camera, after_ns):
        if not out or out[-1] != st["health"]:
            out.append(st["health"])
    return out


def outage(rec: Recorder, camera: str, after_ns: int) -> tuple[int, int]:
    """(publish time of the first stats message after after_ns showing the camera not online,
    of the first after that showing it online again): its outage as the stats topic told it."""
    stats = [s for s in rec.stats() if s.header["publish_ts"] > after_ns]
    health = [
        (s.header["publish_ts"], s.header["stats"]["cameras"][camera]["health"]) for s in stats
    ]
    down = next(t for t, h in health if h != "online")
    up = next(t for t, h in health if t > down and h == "online")
    return down, up


def first_frame_after(rec: Recorder, camera: str, t_ns: int) -> Seen | None:
    return next((s for s in rec.frames(camera) if s.header["capture_ts"] > t_ns), None)


async def recovered(rec: Recorder, camera: str, back_ns: int) -> float:
    """Seconds from back_ns to the publish time of the camera's first frame grabbed after it,
    once the stats topic shows the camera online again."""
    await rec.wait_for(
        lambda: first_frame_after(rec, camera, back_ns) is not None, HANG_S, f"{camera} back"
    )
    await rec.wait_for(
        lambda: health_changes(rec, camera, back_ns)[-1:] == ["online"],
        HANG_S,
        f"{camera} online on the stats topic",
    )
    frame = first_frame_after(rec, camera, back_ns)
    assert frame is not None
    return (frame.header["publish_ts"] - back_ns) / 1e9
