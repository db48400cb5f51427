"""The pose3d rate `npucam plan` predicts for each rig whose groups are posed by detect's per-frame
pose (rig3d `poses = "live"`, docs/rig.md): the groups a second the detect worker(s) sustain.

rig3d publishes one pose3d message per posed group, and with `poses = "live"` every group is
posed once detect has processed each of its views, so the rate is the slowest rig camera's
processed frame rate (the plan's water-filled `detect_fps`, which prices the camera's people
and parts), at most the rig's capture rate (its slowest camera's fps), thinned by
`pose_interval_ms`. detect's `latest` inbox drops whole frames, max-min fairly between cameras,
so the cameras lose frames at one rate. Every person followed in at least `min_views` views is
in every message: the rate per person is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from pipeline.config import Config
from stages.planning.npu import PlanError


@dataclass(frozen=True)
class RigRate:
    """One live rig's predicted pose3d rate. capture_fps: its slowest camera's fps;
    detect_fps: the slowest of its cameras' frames a second detect processes;
    groups_per_s: pose3d messages a second (also per person); limited_by: "cameras",
    "detect" or "pose_interval_ms"."""

    rig: str
    cameras: tuple[str, ...]
    capture_fps: float
    detect_fps: float
    groups_per_s: float
    limited_by: str


def rig_rate(
    rig: str,
    cameras: list[str],
    offered: dict[str, float],
    sustained: dict[str, float],
    pose_interval_ms: float = 0.0,
) -> RigRate:
    """offered: camera -> fps it delivers; sustained: camera -> frames a second detect
    processes (a camera detect does not process counts 0)."""
    capture = min(offered[c] for c in cameras)
    detect = min(sustained.get(c, 0.0) for c in cameras)
    rate, limit = capture, "cameras"
    if detect < rate:
        rate, limit = detect, "detect"
    if pose_interval_ms > 0 and 1e3 / pose_interval_ms < rate:
        rate, limit = 1e3 / pose_interval_ms, "pose_interval_ms"
    return RigRate(rig, tuple(cameras), capture, detect, rate, limit)


def live_rig_rates(
    config: Config, offered: dict[str, float], sustained: dict[str, float]
) -> list[RigRate]:
    """Each `poses = "live"` rig3d stage of the config, in stage order."""
    from stages.rig.stage import Rig3DOptions

    out = []
    for i, stage in enumerate(config.stages):
        if stage.kind != "rig3d":
            continue
        try:
            o = Rig3DOptions.model_validate(stage.options)
        except ValidationError as exc:
            raise PlanError(f"{config.path}: stages[{i}]: invalid rig3d options: {exc}") from None
        if o.poses == "live":
            out.append(rig_rate(o.rig, o.cameras, offered, sustained, o.pose_interval_ms))
    return out
