"""A rig that sees nobody (issue 33, finding 3): docs/protocol.md promises a pose3d message
with `count` 0 for every posed group, but the rig3d stage only looked at its groups when a
pose arrived, so a room with nobody in it published nothing (60-212 complete groups, 0
messages) until shutdown: subscribers could not tell an empty room from a dead rig. Now each
released group is published as it closes, poses or not.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages" / "rig"))

from rig_scenes import ring_cameras  # noqa: E402

from pipeline.config import parse_config  # noqa: E402
from pipeline.graph import Context, check_stages  # noqa: E402
from pipeline.messages import now_ns  # noqa: E402
from pipeline.metrics import Metrics  # noqa: E402
from pipeline.queues import BoundedQueue  # noqa: E402
from stages.rig.calibration import Calibration, write_calibration  # noqa: E402
from stages.rig.groups import RigRegistry  # noqa: E402
from stages.rig.stage import Rig3D  # noqa: E402

MS = 1_000_000
NAMES = ("cam0", "cam1", "cam2")
GROUPS = 12


class Sink:
    def __init__(self) -> None:
        self.items: list = []

    async def send(self, item) -> None:
        self.items.append(item)


def test_every_group_of_an_empty_room_is_published_with_count_0_while_running(tmp_path):
    cams = ring_cameras(np.random.default_rng(0), n=len(NAMES))
    write_calibration(
        tmp_path / "Calib.toml",
        Calibration({f"cam_{i + 1:02d}": c for i, c in enumerate(cams)}),
    )
    config = parse_config(
        {
            "cameras": [
                {"name": n, "url": "synthetic:", "fps": 10.0, "staleness_ms": 5000.0} for n in NAMES
            ],
            "stages": [
                {"kind": "capture"},
                {"kind": "detect", "person": "none", "face": "none"},
                {
                    "kind": "rig3d",
                    "rig": "hall",
                    "cameras": list(NAMES),
                    "calibration": "Calib.toml",
                },
            ],
        },
        tmp_path / "rig.toml",
    )
    (_, _, (_, opts)) = check_stages(config)

    async def go() -> list:
        context = Context(config, Metrics())
        stage = Rig3D("rig3d", opts, context)
        groups = RigRegistry.of(context).of_camera("cam0")
        inbox = BoundedQueue("rig3d", 100, "block", context.metrics)
        inbox.add_producer()
        sink = Sink()
        task = asyncio.create_task(stage.run(inbox, sink))
        await asyncio.sleep(0)  # the stage is waiting on its empty inbox
        arrival = [0]
        groups.grouper.clock = lambda: arrival[0]  # frames arrive 10 ms after capture
        base = now_ns()
        for step in range(GROUPS):
            for v, name in enumerate(NAMES):
                ts = base + step * 100 * MS + v * 3 * MS
                arrival[0] = ts + 10 * MS
                assert groups.place(name, step, ts, ts + 5000 * MS, cams[v].size) is not None
                groups.posed(name, step, [])  # detect found nobody: no pose job
        # no pose ever arrives; the groups are complete and have no job to wait for, so each
        # is due now (the bound only keeps a broken stage from hanging the test)
        for _ in range(200):
            if len(sink.items) == GROUPS:
                break
            await asyncio.sleep(0.05)
        published = list(sink.items)
        inbox.producer_done()
        await task
        return published

    published = asyncio.run(go())
    assert [r.seq for r in published] == list(range(GROUPS))
    assert all(r.points.shape == (0, 308, 4) and r.missing == () for r in published)
    assert all(r.backend == "none" and r.model == "none" for r in published)
