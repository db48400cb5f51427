"""The body stages' CPU in a plan (`npucam plan`): each `body` stage fits every person of
every pose3d group of its rig on one worker thread, at a measured cost per person-frame.

The cost is bench/body_fit.py's steady-state median on one core (docs/benchmarks.md,
"body_fit"); a person's first frame and the phenotype window's last cost more, once per
person (docs/body.md, "In the pipeline"), and are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.config import Config

# seconds per person-frame: bench/body_fit.py's median of 119 steady-state frames on one
# core, 2026-12-03 22:52 UTC (load average 1.6; docs/benchmarks.md, "body_fit"), and with
# the stage's `fingers` (`--fingers`)
BODY_FIT_S = 5.28e-3
BODY_FIT_FINGERS_S = 10.19e-3


@dataclass(frozen=True)
class BodyLoad:
    """One body stage: its rig's groups a second, people a group, and the cores its fits
    ask (person-frames a second times BODY_FIT_S, or BODY_FIT_FINGERS_S with `fingers`) and
    get (its one thread: at most one)."""

    stage: str
    rig: str
    groups_per_s: float
    people: float
    asked: float

    @property
    def predicted(self) -> float:
        return min(1.0, self.asked)


def body_loads(
    config: Config, rates: Mapping[str, float], people: Mapping[str, float]
) -> list[BodyLoad]:
    """Per body stage: rates, camera -> frames a second that reach the rig (after detect);
    people, camera -> mean people a frame. A rig's groups come at its slowest camera's rate
    (at most one every `pose_interval_ms`), each with its cameras' mean people."""
    rigs = {
        s.options.get("rig"): s.options
        for s in config.stages
        if s.kind == "rig3d" and s.options.get("rig")
    }
    out = []
    for name, stage in zip(config.stage_names, config.stages, strict=True):
        if stage.kind != "body":
            continue
        rig = str(stage.options.get("rig"))
        options = rigs.get(rig)
        if options is None:
            continue
        cameras = list(options.get("cameras", []))
        if not cameras or any(c not in rates for c in cameras):
            continue
        groups = min(rates[c] for c in cameras)
        interval_ms = float(options.get("pose_interval_ms", 0.0) or 0.0)
        if interval_ms > 0:
            groups = min(groups, 1000.0 / interval_ms)
        mean_people = sum(people.get(c, 0.0) for c in cameras) / len(cameras)
        cost = BODY_FIT_FINGERS_S if stage.options.get("fingers", False) else BODY_FIT_S
        out.append(BodyLoad(name, rig, groups, mean_people, groups * mean_people * cost))
    return out
