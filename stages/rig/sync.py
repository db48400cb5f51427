"""Frames of a rig's cameras grouped by capture time, so a group's views are posed and
triangulated together.

A frame joins the open group that keeps its span (max - min capture time) within the
tolerance, default half the shortest frame period, and has no view of its camera yet (the
group whose mean is nearest), or else opens a group. A group closes when every camera is in
it; when every camera missing from it has delivered a frame too late to fit (that view will
not come); or when it has waited `wait` since it opened: it then goes out with the views it
has. Groups are released in capture order; a frame for a group already released is dropped
and counted late. Pure logic: the clock (monotonic ns) is injected.

Capture times come from each camera's own clock, so each is checked against the rig's by
arrival (ClockCheck): a camera's delay is its arrival time (the
injected clock) minus its capture time; its baseline is the lower quartile of its recent
delays (queueing only adds delay), and its offset is the rig's baseline (the median camera's)
minus its own, positive when its clock runs ahead. A frame stamped ahead of its own camera's
recent frames by more than `max_offset` is refused (`clock_outliers`); a camera whose offset
is beyond `max_offset` has its capture times corrected by it (`corrected`, reported with the
offset), so one wrong clock moves its own frames, never the groups of the others. A group
waits for a missing camera until that camera's own delay since the group's capture time has
passed, plus `wait`.
"""

from __future__ import annotations

import math
import time
from collections import deque
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


CLOCK_WINDOW = 32  # recent delays kept per camera
CLOCK_MIN_SAMPLES = 8  # delays a camera needs before its clock is judged
RELEASED_KEPT = 64  # released groups remembered for the late rule


class ClockCheck:
    """Each camera's clock against the rig's, from arrival times (module docstring).
    offset(c): ns its clock runs ahead of the rig's (None until judged); correction(c): what
    is subtracted from its capture times (its offset when beyond max_offset_ns, else 0)."""

    def __init__(self, cameras: tuple[str, ...], max_offset_ns: int) -> None:
        self.max_offset_ns = max_offset_ns
        self._delays: dict[str, deque[int]] = {c: deque(maxlen=CLOCK_WINDOW) for c in cameras}
        self._baseline: dict[str, int] = {}
        self.corrections: dict[str, int] = dict.fromkeys(cameras, 0)
        self.outliers: dict[str, int] = dict.fromkeys(cameras, 0)

    def observe(self, camera: str, delay: int) -> bool:
        """Record one frame's delay (arrival - capture, ns); False if the frame is stamped
        ahead of its camera's recent frames by more than max_offset_ns (an outlier)."""
        window = self._delays[camera]
        window.append(delay)
        if len(window) >= CLOCK_MIN_SAMPLES:
            self._baseline[camera] = sorted(window)[len(window) // 4]
        base = self._baseline.get(camera)
        if base is not None and delay < base - self.max_offset_ns:
            self.outliers[camera] += 1
            return False
        return True

    def reference(self) -> int | None:
        """The rig's baseline delay: the median camera's (the upper one of two), or None
        while fewer than two cameras are judged."""
        known = sorted(self._baseline.values())
        return known[len(known) // 2] if len(known) >= 2 else None

    def offset(self, camera: str) -> int | None:
        ref = self.reference()
        base = self._baseline.get(camera)
        return None if ref is None or base is None else ref - base

    def update(self, camera: str) -> bool:
        """Set the camera's correction from its offset; True when it changed."""
        off = self.offset(camera)
        new = off if off is not None and abs(off) > self.max_offset_ns else 0
        # a correction in effect follows the offset only when it moved by more than the bound
        old = self.corrections[camera]
        if (new == 0) == (old == 0) and abs(new - old) <= self.max_offset_ns:
            return False
        self.corrections[camera] = new
        return True

    def expected_delay(self, camera: str) -> int | None:
        """Arrival minus corrected capture time of this camera's frames, or None if unknown."""
        base = self._baseline.get(camera)
        return None if base is None else base + self.corrections[camera]


class FrameGrouper:
    """Groups frames of the cameras in `fps` (camera -> frames per second)."""

    def __init__(
        self,
        fps: Mapping[str, float],
        tolerance_ns: int | None = None,
        wait_ns: int | None = None,
        max_open: int = 64,
        clock: Callable[[], int] = time.monotonic_ns,
        max_offset_ns: int | None = None,
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
        # a clock further off than the wait would release its views' groups alone
        self.clocks = ClockCheck(
            self.cameras, self.wait_ns if max_offset_ns is None else max_offset_ns
        )
        self.late = 0  # frames dropped because their group had been released
        self._open: list[FrameGroup] = []  # by first_ts
        self._latest: dict[str, int] = {}  # camera -> latest (corrected) capture_ts delivered
        self._released: deque[tuple[int, frozenset[str]]] = deque(maxlen=RELEASED_KEPT)
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
        if not self.clocks.observe(camera, self.clock() - capture_ts):
            return None, self.expire()
        if self.clocks.update(camera):
            self._reanchor(camera)
        capture_ts -= self.clocks.corrections[camera]
        view = View(camera, seq, capture_ts, item)
        tol = self.tolerance_ns
        fits = [
            g
            for g in self._open
            if camera not in g.views
            and max(g.last_ts, capture_ts) - min(g.first_ts, capture_ts) <= tol
        ]
        released = max((ts for ts, _ in self._released), default=None)
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
        return self._deadline(self._open[0]) if self._open else None

    def offsets(self) -> dict[str, int | None]:
        """camera -> ns its clock runs ahead of the rig's (None until judged)."""
        return {c: self.clocks.offset(c) for c in self.cameras}

    def _deadline(self, group: FrameGroup) -> int:
        """When the group stops waiting: `wait` after it opened, or after the latest time
        a missing camera's frame of its instant is due by that camera's own delay."""
        due = [
            group.first_ts + d
            for c in self.cameras
            if c not in group.views and (d := self.clocks.expected_delay(c)) is not None
        ]
        return max([group.opened_at, *due]) + self.wait_ns

    def _closed(self, group: FrameGroup, now: int) -> bool:
        missing = [c for c in self.cameras if c not in group.views]
        passed = all(
            self._latest.get(c, -math.inf) > group.first_ts + self.tolerance_ns for c in missing
        )
        return passed or now >= self._deadline(group)

    def _release(self, group: FrameGroup) -> FrameGroup:
        group.missing = tuple(c for c in self.cameras if c not in group.views)
        self._released.append((group.first_ts, frozenset(group.views)))
        return group

    def _reanchor(self, camera: str) -> None:
        """The camera's correction changed: its views placed on the old one leave the open
        groups, and groups released with its views alone stop setting what is late."""
        for group in self._open:
            group.views.pop(camera, None)
        self._open = [g for g in self._open if g.views]
        only = frozenset([camera])
        kept = [r for r in self._released if r[1] != only]
        self._released = deque(kept, maxlen=RELEASED_KEPT)
        self._latest.pop(camera, None)
