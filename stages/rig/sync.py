"""Frames of a rig's cameras grouped by capture time, so a group's views are posed and
triangulated together.

A frame joins the open group that keeps its span (max - min capture time) within the
tolerance, default half the shortest frame period, and has no view of its camera yet (the
group whose mean is nearest), or else opens a group. A group closes when every camera is in
it; when every camera missing from it has delivered a frame too late to fit (that view will
not come); or when it has waited `wait` since it opened: it then goes out with the views it
has. Groups are released in capture order; a frame for a group already released is dropped
and counted late. Pure logic: the clock (monotonic ns) is injected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pipeline.errors import NpucamError


class SyncError(NpucamError):
    """A rig description or frame the grouper cannot accept; names the camera."""


@dataclass(frozen=True)
class View:
    camera: str
    seq: int
    capture_ts: int  # ns
    item: object = None


@dataclass
class FrameGroup:
    """Views of one instant, by camera, and the cameras missing from it."""

    views: dict[str, View]
    missing: tuple[str, ...] = ()
    opened_at: int = field(default=0, repr=False)  # clock ns
    id: int = -1  # the grouper's count of groups opened before this one

    @property
    def first_ts(self) -> int:
        return min(v.capture_ts for v in self.views.values())

    @property
    def last_ts(self) -> int:
        return max(v.capture_ts for v in self.views.values())

    @property
    def capture_ts(self) -> int:
        """The group's instant: the mean capture time of its views, ns."""
        return sum(v.capture_ts for v in self.views.values()) // len(self.views)

    @property
    def skew_ns(self) -> int:
        return self.last_ts - self.first_ts


class FrameGrouper:
    """Groups frames of the cameras in `fps` (camera -> frames per second)."""

    def __init__(
        self,
        fps: Mapping[str, float],
        tolerance_ns: int | None = None,
        wait_ns: int | None = None,
        max_open: int = 64,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if not fps:
            raise SyncError("a rig needs at least one camera")
        for camera, rate in fps.items():
            if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
                raise SyncError(f"camera {camera!r}: fps must be a positive number, got {rate!r}")
        self.cameras = tuple(fps)
        # half the shortest frame period: two frames of one camera never fit one group
        self.tolerance_ns = (
            round(0.5e9 / max(fps.values())) if tolerance_ns is None else tolerance_ns
        )
        # two of the slowest camera's frame periods
        self.wait_ns = round(2e9 / min(fps.values())) if wait_ns is None else wait_ns
        self.max_open = max_open
        self.clock = clock
        self.late = 0  # frames dropped because their group had been released
        self._open: list[FrameGroup] = []  # by first_ts
        self._latest: dict[str, int] = {}  # camera -> latest capture_ts delivered
        self._released_first: int | None = None
        self._opened = 0

    def add(self, camera: str, seq: int, capture_ts: int, item: object = None) -> list[FrameGroup]:
        """Take one frame; returns the groups that closes, in capture order."""
        return self.place(camera, seq, capture_ts, item)[1]

    def place(
        self, camera: str, seq: int, capture_ts: int, item: object = None
    ) -> tuple[FrameGroup | None, list[FrameGroup]]:
        """Take one frame: (the group it joined or opened, None if it came late; the groups
        that closes, in capture order, which may include its own)."""
        if camera not in self.cameras:
            raise SyncError(f"camera {camera!r} is not in the rig ({', '.join(self.cameras)})")
        view = View(camera, seq, capture_ts, item)
        tol = self.tolerance_ns
        fits = [
            g
            for g in self._open
            if camera not in g.views
            and max(g.last_ts, capture_ts) - min(g.first_ts, capture_ts) <= tol
        ]
        released = self._released_first
        group = None
        if released is not None and capture_ts < released:
            self.late += 1  # joining any group would release it out of order
        elif fits:
            group = min(fits, key=lambda g: abs(g.capture_ts - capture_ts))
            group.views[camera] = view
        elif released is not None and capture_ts <= released + tol:
            self.late += 1  # its place was in the group released last
        else:
            group = FrameGroup({camera: view}, opened_at=self.clock(), id=self._opened)
            self._opened += 1
            self._open.append(group)
        self._open.sort(key=lambda g: g.first_ts)
        self._latest[camera] = max(self._latest.get(camera, capture_ts), capture_ts)
        return group, self.expire()

    def expire(self) -> list[FrameGroup]:
        """Release the groups closed by now (call at next_deadline); in capture order."""
        now = self.clock()
        out = []
        while self._open and (len(self._open) > self.max_open or self._closed(self._open[0], now)):
            out.append(self._release(self._open.pop(0)))
        return out

    def flush(self) -> list[FrameGroup]:
        """Release every open group (end of input)."""
        out = [self._release(g) for g in self._open]
        self._open = []
        return out

    def next_deadline(self) -> int | None:
        """Clock ns at which the oldest open group times out, or None if none is open."""
        return self._open[0].opened_at + self.wait_ns if self._open else None

    def _closed(self, group: FrameGroup, now: int) -> bool:
        missing = [c for c in self.cameras if c not in group.views]
        passed = all(
            self._latest.get(c, -math.inf) > group.first_ts + self.tolerance_ns for c in missing
        )
        return passed or now - group.opened_at >= self.wait_ns

    def _release(self, group: FrameGroup) -> FrameGroup:
        group.missing = tuple(c for c in self.cameras if c not in group.views)
        self._released_first = group.first_ts
        return group
