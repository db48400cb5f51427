"""What the body stage tests feed it: a run's Context and a rig's pose3d results."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.config import parse_config
from pipeline.graph import Context
from pipeline.metrics import Metrics
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
