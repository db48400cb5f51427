"""The pose3d rate `npucam plan` predicts for each rig whose groups are posed by detect's per-frame
pose (rig3d `poses = "live"`, docs/rig.md), from the frames a second the detect worker(s)
sustain for each rig camera (the plan's water-filled `detect_fps`, which prices the camera's
people and parts).

rig3d publishes one pose3d message per group that has at least one view, and triangulates a
person in a group where at least `min_views` of the views that see them were processed. When
detect keeps up, every group has every view. When it does not, its `latest` inbox serves the
cameras in turn, each time with that camera's newest frame, so which instant of a camera gets
processed does not depend on the other cameras: camera c's view of a group is there with
probability p_c = detect_fps_c / fps_c, independently, and the number of views a group has is
Poisson-binomial over the cameras. Measured on configs/studio-3d-multi.toml (docs/benchmarks.md,
"rig_rate"): groups formed 2.38/s against 2.21/s from this model at the run's own p.
Groups come at the slowest rig camera's fps, thinned by `pose_interval_ms`; a person is taken
as seen by every rig camera.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from pipeline.config import Config
from stages.planning.npu import PlanError


@dataclass(frozen=True)
class RigRate:
    """One live rig's prediction. group_fps: the groups a second its cameras make (the slowest
    camera's fps, thinned by pose_interval_ms); view_fraction: camera -> the fraction of its
    frames detect processes; messages_per_s: pose3d messages (groups with a view);
    per_person_per_s: pose3d messages a second in which a person seen by every camera is
    triangulated (groups with min_views of its views); limited_by: "cameras", "detect" or
    "pose_interval_ms"."""

    rig: str
    cameras: tuple[str, ...]
    group_fps: float
    view_fraction: dict[str, float]
    min_views: int
    messages_per_s: float
    per_person_per_s: float
    limited_by: str


def views_at_least(p: list[float], k: int) -> float:
    """P(at least k of independent events of probabilities p happen) (Poisson-binomial)."""
    dist = [1.0]  # dist[j]: P(exactly j of the events so far)
    for q in p:
        dist = [
            (dist[j] if j < len(dist) else 0.0) * (1 - q) + (dist[j - 1] * q if j else 0.0)
            for j in range(len(dist) + 1)
        ]
    return float(sum(dist[k:]))


def rig_rate(
    rig: str,
    cameras: list[str],
    offered: dict[str, float],
    sustained: dict[str, float],
    pose_interval_ms: float = 0.0,
    min_views: int = 2,
) -> RigRate:
    """offered: camera -> fps it delivers; sustained: camera -> frames a second detect
    processes (a camera detect does not process counts 0)."""
    fps = min(offered[c] for c in cameras)
    group_fps, limit = fps, "cameras"
    if pose_interval_ms > 0 and 1e3 / pose_interval_ms < fps:
        group_fps, limit = 1e3 / pose_interval_ms, "pose_interval_ms"
    fraction = {
        c: min(1.0, sustained.get(c, 0.0) / offered[c]) if offered[c] > 0 else 0.0 for c in cameras
    }
    if limit == "cameras" and min(fraction.values()) < 1.0:
        limit = "detect"
    p = list(fraction.values())
    return RigRate(
        rig,
        tuple(cameras),
        group_fps,
        fraction,
        min_views,
        group_fps * views_at_least(p, 1),
        group_fps * views_at_least(p, min_views),
        limit,
    )


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
            out.append(
                rig_rate(o.rig, o.cameras, offered, sustained, o.pose_interval_ms, o.min_views)
            )
    return out
