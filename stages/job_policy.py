"""Which enabled models get a job for each target of a frame: the one job policy of the detect
stage (stages/detect.py) and of npucam plan's simulation of it (stages/planning/npu.py).

A model declares what it runs on and how often (npu.models.RunsOn, on its ModelSpec); the
detect stage's keys set the limits of the targets it has keys for (`settings`), and `decide`
picks, per frame, the (model, target) pairs that become jobs; the model's runtime makes the
job (stages.runtimes.Runtime.make_job). Pure: no I/O and no clock reads; a frame's capture
time and the camera's interval marks are passed in.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from npu.models import RunsOn

MIN_REGION_PX = 2  # a region narrower or lower than this is no target (a degenerate crop)


@dataclass(frozen=True, slots=True)
class Target:
    """One thing in a frame a model can run on.

    kind: "person", "face", "frame" or "region" (npu.models.RunsOn.target). box_xywh:
    float32 [4] in frame pixels (None where the caller has no pixels, as the planner).
    landmarks: float32 [5, 2] (YuNet) or [4, 2] (BlazeFace) alignment points of a face, and
    landmark_source who found them ("" without landmarks: a face the aligner cannot use).
    refresh: a person's place in its tracker's refresh order (oldest result first), None
    when it is not due (its refresh in flight, or refreshes off this frame); since_ns: the
    capture time of its last refreshed result (None: never). group: the rig group a posed
    frame's persons are refreshed for (stages.rig.groups.RigTag), None outside one.
    """

    kind: str
    box_xywh: np.ndarray | None = None
    track_id: int | None = None
    score: float = 0.0
    landmarks: np.ndarray | None = None
    landmark_source: str = ""
    refresh: int | None = None
    since_ns: int | None = None
    group: Hashable | None = None

    @property
    def has_landmarks(self) -> bool:
        return self.landmark_source != ""


def xywh(xyxy: np.ndarray) -> np.ndarray:
    """A box [x1, y1, x2, y2] as float32 [x, y, w, h]."""
    b = np.asarray(xyxy, np.float32).reshape(4)
    return np.array([b[0], b[1], b[2] - b[0], b[3] - b[1]], np.float32)


def person_targets(
    tracker: Any,
    boxes_of: dict[int, np.ndarray],
    pose: bool,
    rig: Any,
    group: Any,
    every: bool = False,
) -> list[Target]:
    """A frame's tracked persons (track id -> box xyxy) as targets, each with its place in the
    refresh order when it is due: the tracker's pose queue (oldest pose first), or in a rig's
    posed group (`group` set) its largest people (rig.chosen); none in a rig's frame outside
    a posed group, nor with `pose` off. every (outside a rig): every tracked person is due,
    by track id, whether or not its last refresh is done. Detect and the planner both make
    them so."""
    order: list[int] = []
    if pose and group is not None and rig is not None:
        order = list(rig.chosen(boxes_of))
    elif pose and rig is None and every:
        order = sorted(boxes_of)
    elif pose and rig is None:
        order = [t.track_id for t in tracker.pose_queue() if t.track_id in boxes_of]
    place = {tid: i for i, tid in enumerate(order)}
    targets = []
    for tid, box in boxes_of.items():
        if (track := tracker.track(tid)) is not None:
            targets.append(
                Target(
                    "person",
                    xywh(box),
                    track_id=tid,
                    score=track.score,
                    refresh=place.get(tid),
                    since_ns=track.pose_ts_ns,
                    group=group,
                )
            )
    return targets


@dataclass(frozen=True, slots=True)
class Wanted:
    """An enabled model the detect stage makes jobs for, with its settings in effect."""

    model: str
    runs_on: RunsOn


def settings(runs_on: RunsOn, detect: Any) -> RunsOn | None:
    """A model's RunsOn with the detect stage's keys (stages.detect.DetectOptions) applied
    where they name its target: refreshes are `pose` / `pose_jobs_per_frame`, faces `faces`
    / `face_interval_s`, regions `clip` / `clip_interval_s` / `clip_max_per_frame`. None when
    those keys turn its jobs off."""
    if runs_on.cadence == "refresh":
        return replace(runs_on, max_per_frame=detect.pose_jobs_per_frame) if detect.pose else None
    if runs_on.target == "face":
        if not detect.faces:
            return None
        return replace(runs_on, interval_s=detect.face_interval_s)
    if runs_on.target == "region":
        if detect.clip == "off":
            return None
        return replace(
            runs_on, interval_s=detect.clip_interval_s, max_per_frame=detect.clip_max_per_frame
        )
    return runs_on


def wanted(declared: Iterable[tuple[str, RunsOn | None]], detect: Any) -> list[Wanted]:
    """The models (name, declaration) that get jobs under the detect keys `detect`, in the
    order given (the registry's); a model declaring nothing gets none from detect."""
    out = []
    for model, runs_on in declared:
        s = None if runs_on is None else settings(runs_on, detect)
        if s is not None:
            out.append(Wanted(model, s))
    return out


def due(marks: dict[str, int], key: str, t_ns: int, interval_s: float) -> bool:
    """A per-camera rate limit on capture time: True (and t_ns noted under key) once
    interval_s passed since the last noted time, or when the clock went back past it (a jump
    must not mute a camera)."""
    last = marks.get(key)
    if last is not None and 0 <= t_ns - last < interval_s * 1e9:
        return False
    marks[key] = t_ns
    return True


def decide(
    models: Sequence[Wanted],
    targets: Sequence[Target],
    t_ns: int,
    marks: dict[str, int],
    *,
    refresh_all: bool = False,
) -> list[tuple[str, Target]]:
    """The jobs of one frame captured at t_ns: (model, target) pairs, model by model in the
    order of `models`, each model's targets in the order given (refreshes: by their place).

    "frame" cadence: every target of the model's kind; "interval": all of them when the
    camera has any target of that kind and the model's interval passed (`due` on `marks`,
    the camera's); "refresh": the due persons, max_per_frame of them (refresh_all: every
    one, a rig's posed group). A face model takes only faces with landmarks. max_per_frame
    caps each model's jobs a frame."""
    jobs: list[tuple[str, Target]] = []
    for w in models:
        r = w.runs_on
        mine = [x for x in targets if x.kind == r.target]
        limit = r.max_per_frame
        if r.cadence == "interval" and not (mine and due(marks, w.model, t_ns, r.interval_s)):
            continue
        if r.cadence == "refresh":
            mine = sorted((x for x in mine if x.refresh is not None), key=_refresh_place)
            limit = None if refresh_all else limit
        if r.target == "face":
            mine = [x for x in mine if x.has_landmarks]
        jobs.extend((w.model, x) for x in mine[:limit])
    return jobs


def _refresh_place(target: Target) -> int:
    return target.refresh if target.refresh is not None else 0


def regions(
    boxes_xywh: dict[int, np.ndarray], frame_wh: tuple[int, int], whole_frame: bool
) -> list[Target]:
    """The region targets of a frame: the whole frame, or each tracked person's box
    (float32 [4] xywh by track id) by track id, the degenerate ones left out."""
    if whole_frame:
        w, h = frame_wh
        return [Target("region", np.array([0, 0, w, h], np.float32))]
    return [
        Target("region", box, track_id=tid)
        for tid, box in sorted(boxes_xywh.items())
        if box[2] >= MIN_REGION_PX and box[3] >= MIN_REGION_PX
    ]
