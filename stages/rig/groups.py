"""A live rig's frame groups, shared by the detect stage (which places every frame of the rig's
cameras in a group by capture time and sends pose jobs for the frames of the groups chosen
to be posed) and the rig3d stage (which collects a posed group's 2D poses and triangulates
them): one RigGroups per rig, found by camera through the run's RigRegistry (Context.shared).

Grouping is stages.rig.sync's FrameGrouper. Whether a group is posed is decided when it
opens (at most one posed group per `pose_interval_ns` of capture time), so every view of it
gets the same answer; its pose jobs carry a RigTag, which the scheduler uses to run a
group's jobs together (docs/rig.md).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import NpucamError
from stages.rig.sync import FrameGroup, FrameGrouper

MAX_POSED = 256  # posed groups remembered at once (the oldest are forgotten first)


class RigError(NpucamError):
    """A rig that cannot be set up in this run: a name or a camera taken by another rig."""


@dataclass(frozen=True, slots=True)
class RigTag:
    """What a pose job of a posed group carries: the rig and the group's number. Jobs with
    one tag share a priority in the scheduler and run back to back."""

    rig: str
    group: int


@dataclass
class PosedGroup:
    """A posed group's frames and pose jobs. views: camera -> (seq, capture_ts_ns,
    deadline_ns) of its frame; jobs: camera -> the track ids detect sent pose jobs for (a
    camera is absent until detect has made its jobs); closed: no view will join any more."""

    id: int
    views: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    jobs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    closed: bool = False
    missing: tuple[str, ...] = ()

    @property
    def capture_ts_ns(self) -> int:
        """The mean capture time of its frames (FrameGroup.capture_ts)."""
        return sum(v[1] for v in self.views.values()) // len(self.views)

    @property
    def skew_ns(self) -> int:
        times = [v[1] for v in self.views.values()]
        return max(times) - min(times)

    @property
    def deadline_ns(self) -> int:
        """When the last of its pose jobs is past its frame's deadline: no result comes later."""
        return max(v[2] for v in self.views.values())

    def expected(self) -> set[tuple[str, int]] | None:
        """The (camera, track id) poses it waits for, or None while views may still join or
        detect has not made every view's jobs."""
        if not self.closed or any(c not in self.jobs for c in self.views):
            return None
        return {(c, t) for c, tracks in self.jobs.items() for t in tracks}


@dataclass
class SyncStats:
    """Counters of every group the rig formed (posed or not)."""

    groups: int = 0
    complete: int = 0  # groups with every camera
    posed: int = 0
    skew_ns_sum: int = 0
    skew_ns_max: int = 0


class RigGroups:
    """One rig's grouping (thread-safe: detect's worker and rig3d's thread both call it).

    fps: camera -> frames per second (the tolerance and wait of FrameGrouper follow from
    them unless given); pose_interval_ns: capture time between posed groups (0: every group);
    max_people: pose jobs per camera per posed frame. clock: monotonic ns (FrameGrouper's).
    live: its groups are posed by detect's per-frame poses (rig3d `poses = "live"`), not by
    Sapiens2 jobs of the group."""

    def __init__(
        self,
        name: str,
        fps: Mapping[str, float],
        tolerance_ns: int | None = None,
        wait_ns: int | None = None,
        pose_interval_ns: int = 0,
        max_people: int = 4,
        clock: Callable[[], int] = time.monotonic_ns,
        live: bool = False,
    ) -> None:
        self.name = name
        self.live = live
        self.grouper = FrameGrouper(fps, tolerance_ns, wait_ns, clock=clock)
        self.cameras = self.grouper.cameras
        self.pose_interval_ns = pose_interval_ns
        self.max_people = max_people
        self.stats = SyncStats()
        self.sizes: dict[str, tuple[int, int]] = {}  # camera -> (width, height), first frame
        self._lock = threading.Lock()
        self._posed: OrderedDict[int, PosedGroup] = OrderedDict()
        self._group_of: dict[tuple[str, int], int] = {}  # (camera, seq) of posed frames
        self._last_posed_ts: int | None = None

    def place(
        self, camera: str, seq: int, capture_ts_ns: int, deadline_ns: int, size: tuple[int, int]
    ) -> RigTag | None:
        """Detect: put a frame in its group; its tag if the group is posed, else None (a group
        not posed, or a frame too late for its group)."""
        with self._lock:
            self.sizes.setdefault(camera, size)
            group, closed = self.grouper.place(camera, seq, capture_ts_ns)
            if group is not None and len(group.views) == 1:
                self._opened(group)
            tag = None
            plan = None if group is None else self._posed.get(group.id)
            if group is not None and plan is not None:
                # the capture time on the rig's clock (corrected when the camera's is off)
                plan.views[camera] = (seq, group.views[camera].capture_ts, deadline_ns)
                self._group_of[camera, seq] = plan.id
                tag = RigTag(self.name, plan.id)
            self._closed(closed)
            return tag

    def chosen(self, boxes: Mapping[int, Any]) -> list[int]:
        """The track ids a posed frame poses, of its tracked boxes (track id -> x1, y1, x2,
        y2): the largest boxes first, ties by id, up to max_people."""

        def area(track_id: int) -> float:
            x1, y1, x2, y2 = boxes[track_id]
            return float((x2 - x1) * (y2 - y1))

        return sorted(boxes, key=lambda t: (-area(t), t))[: self.max_people]

    def posed(self, camera: str, seq: int, track_ids: Iterable[int]) -> None:
        """Detect: the pose jobs it sent for a frame of a posed group (none is fine)."""
        with self._lock:
            plan = self._posed.get(self._group_of.get((camera, seq), -1))
            if plan is not None:
                plan.jobs[camera] = tuple(int(t) for t in track_ids)

    def expire(self) -> None:
        """Close the groups whose wait is over (FrameGrouper.expire)."""
        with self._lock:
            self._closed(self.grouper.expire())

    def next_deadline(self) -> int | None:
        """Clock ns at which the oldest open group times out (FrameGrouper.next_deadline)."""
        with self._lock:
            return self.grouper.next_deadline()

    def group_of(self, camera: str, seq: int) -> int | None:
        """The posed group of a frame, None for a frame of no posed group."""
        with self._lock:
            return self._group_of.get((camera, seq))

    def posed_groups(self) -> list[PosedGroup]:
        """Snapshots of the posed groups not yet forgotten, in the order they opened."""
        with self._lock:
            return [
                PosedGroup(g.id, dict(g.views), dict(g.jobs), g.closed, g.missing)
                for g in self._posed.values()
            ]

    def forget(self, group: int) -> None:
        """Rig3d: done with a posed group."""
        with self._lock:
            self._forget(group)

    def gauges(self) -> dict[str, float]:
        """Sync numbers for the stats topic: groups formed, complete and posed, frames too
        late for their group, mean and max skew (ms); the largest camera clock offset from
        the rig's (ms), the cameras whose times are corrected by it, frames refused as
        stamped ahead of their camera's own (stages.rig.sync)."""
        with self._lock:
            s = self.stats
            clocks = self.grouper.clocks
            offsets = [v for v in self.grouper.offsets().values() if v is not None]
            return {
                "groups": s.groups,
                "complete_groups": s.complete,
                "posed_groups": s.posed,
                "late_frames": self.grouper.late,
                "skew_mean_ms": s.skew_ns_sum / s.groups / 1e6 if s.groups else 0.0,
                "skew_max_ms": s.skew_ns_max / 1e6,
                "clock_offset_max_ms": max(map(abs, offsets), default=0) / 1e6,
                "clock_corrected_cameras": sum(v != 0 for v in clocks.corrections.values()),
                "clock_outliers": sum(clocks.outliers.values()),
            }

    def clock_offsets(self) -> dict[str, int | None]:
        """camera -> ns its clock runs ahead of the rig's (None until judged)."""
        with self._lock:
            return self.grouper.offsets()

    def clock_report(self) -> dict[str, str]:
        """camera -> how its clock compares with the rig's (for the stats topic's info)."""
        with self._lock:
            clocks = self.grouper.clocks
            out = {}
            for camera, off in self.grouper.offsets().items():
                if off is None:
                    out[camera] = "not judged yet"
                    continue
                state = "corrected" if clocks.corrections[camera] else "in step"
                out[camera] = (
                    f"{state}, clock {off / 1e6:+.1f} ms against the rig's, "
                    f"{clocks.outliers[camera]} frames stamped ahead refused"
                )
            return out

    def _opened(self, group: FrameGroup) -> None:
        last = self._last_posed_ts
        if last is not None and group.first_ts - last < self.pose_interval_ns:
            return
        self._last_posed_ts = group.first_ts
        self.stats.posed += 1
        self._posed[group.id] = PosedGroup(group.id)
        while len(self._posed) > MAX_POSED:
            self._forget(next(iter(self._posed)))

    def _forget(self, group: int) -> None:
        plan = self._posed.pop(group, None)
        if plan is not None:
            for camera, (seq, _, _) in plan.views.items():
                self._group_of.pop((camera, seq), None)

    def _closed(self, groups: list[FrameGroup]) -> None:
        for group in groups:
            s = self.stats
            s.groups += 1
            s.complete += not group.missing
            s.skew_ns_sum += group.skew_ns
            s.skew_ns_max = max(s.skew_ns_max, group.skew_ns)
            plan = self._posed.get(group.id)
            if plan is not None:
                plan.closed = True
                plan.missing = group.missing


class RigRegistry:
    """One run's rigs, by name and by camera: how detect finds the rig of a frame's camera.
    Get it with RigRegistry.of(context); a rig3d stage adds its rig when it is built."""

    def __init__(self) -> None:
        self._rigs: dict[str, RigGroups] = {}
        self._by_camera: dict[str, RigGroups] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, context: Any) -> RigRegistry:
        return context.shared("stages.rig.groups", cls)

    def add(self, rig: RigGroups) -> None:
        with self._lock:
            if rig.name in self._rigs:
                raise RigError(f"rig {rig.name!r}: two rig3d stages name this rig")
            taken = [c for c in rig.cameras if c in self._by_camera]
            if taken:
                other = self._by_camera[taken[0]].name
                raise RigError(f"rig {rig.name!r}: camera {taken[0]!r} is in rig {other!r} too")
            self._rigs[rig.name] = rig
            self._by_camera.update(dict.fromkeys(rig.cameras, rig))

    def of_camera(self, camera: str) -> RigGroups | None:
        return self._by_camera.get(camera)
