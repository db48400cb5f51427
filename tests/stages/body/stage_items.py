"""What the body stage tests feed it: a run's Context and a rig's pose3d results, and a stage
run over them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.config import parse_config
from pipeline.graph import Context, Outbox
from pipeline.messages import Result
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue
from stages.body.stage import Body, BodyOptions
from stages.rig.pose3d import Pose3DResult


def run_context(tmp_path: Path) -> Context:
    """A run's context whose config's folder (where the stage writes its files) is tmp_path."""
    return Context(
        parse_config({"stages": [{"kind": "capture"}]}, tmp_path / "run.toml"), Metrics()
    )


def pose3d(rig: str, seq: int, points: np.ndarray, person: int = 3) -> Pose3DResult:
    """Group seq of rig (capture time seq ns), one person's points [1, 308, 4]."""
    return Pose3DResult(
        camera=rig,
        seq=seq,
        capture_ts_ns=seq,
        deadline_ns=2**62,
        points=points.astype(np.float32),
        person_ids=(person,),
    )


def run_groups(options: BodyOptions, context: Context, groups: Sequence[Pose3DResult]) -> tuple:
    """A body stage fed `groups` until its inbox closes: (a result per group, the stage)."""

    async def run() -> tuple[list, Body]:
        stage = Body("body", options, context)
        inbox = BoundedQueue("body", 8, "block", context.metrics)
        published = BoundedQueue("publish", 8, "block", context.metrics)
        out = Outbox("body", [("publish", (Result,), published)], context.metrics)
        for group in groups:
            await inbox.put(group)
        inbox.close()
        await stage.run(inbox, out)
        return [await published.get() for _ in groups], stage

    return asyncio.run(run())
