"""ID switches of a rig's 3D people, counted online from where each rig person id is (no ground
truth): Pose2Sim's multi-person tracking rule (Pose2Sim/personAssociation.py, `max_distance_m`:
a person cannot jump farther than that between frames) turned into two counters.

- **jump**: an id seen at two consecutive instants farther from where it was than
  `max_speed_m_s` allows over the time between them, but never more than `max_step_m`
  (Pose2Sim's 1 m: a rig paced slower than its recording, or a slow camera, would otherwise
  allow any jump), plus `slack_m` for triangulation noise, and it stays there: the id passed
  to another person. A position that jumps and comes back at the next instant is a bad
  triangulation (two views that did not agree), counted apart as a glitch.
- **rejoin**: a new id appears within `rejoin_m` of where an id that is absent now was last
  seen, at most `memory` updates (published groups) ago, as long as the rig3d stage keeps an
  id whose tracks are gone (`person_max_age`): a person lost one id and took another. Counted
  in groups, not seconds, so a rig paced slower than its recording forgets as late.

A person's position is the mid-point of the triangulated hips (the median of every
triangulated point when a hip is missing or the keypoints are not Sapiens2's 308).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npu.models.sapiens2.keypoints import NAMES

HIPS = (NAMES.index("left_hip"), NAMES.index("right_hip"))


def person_centre(points: np.ndarray) -> np.ndarray | None:
    """points float [K, 3] (NaN where not triangulated) -> [3], or None when none is."""
    if points.shape[0] == len(NAMES):
        hips = points[list(HIPS)]
        if np.isfinite(hips).all():
            return hips.mean(axis=0)
    finite = points[np.isfinite(points).all(axis=-1)]
    return np.median(finite, axis=0) if len(finite) else None


@dataclass
class _Seen:
    t_s: float
    centre: np.ndarray
    update: int


class IdSwitches:
    """`update(t_s, ids, points)` once per published instant (t_s increasing); counters:
    jumps, rejoins, glitches, new_ids; `switches` = jumps + rejoins."""

    def __init__(
        self,
        max_speed_m_s: float = 3.0,
        max_step_m: float = 0.7,
        slack_m: float = 0.3,
        rejoin_m: float = 0.5,
        memory: int = 30,
    ) -> None:
        self.max_speed_m_s = max_speed_m_s
        self.max_step_m = max_step_m
        self.slack_m = slack_m
        self.rejoin_m = rejoin_m
        self.memory = memory
        self._updates = 0
        self._last: dict[int, _Seen] = {}  # id -> where it was last, within memory updates
        self._pending: dict[int, _Seen] = {}  # id -> a far position not yet confirmed
        self._known: set[int] = set()
        self.jumps = 0
        self.rejoins = 0
        self.glitches = 0
        self.new_ids = 0

    @property
    def switches(self) -> int:
        return self.jumps + self.rejoins

    def update(self, t_s: float, ids: tuple[int, ...], points: np.ndarray) -> None:
        """ids [P] rig person ids; points float [P, K, 3] world metres (NaN where not
        triangulated)."""
        self._updates += 1
        self._last = {
            i: s for i, s in self._last.items() if self._updates - s.update <= self.memory
        }
        absent = {i: s for i, s in self._last.items() if i not in ids}
        for p, rid in enumerate(ids):
            centre = person_centre(np.asarray(points[p], np.float64))
            if rid not in self._known:
                self._known.add(rid)
                self.new_ids += 1
                if centre is not None and self._near(centre, absent.values(), self.rejoin_m):
                    self.rejoins += 1
            if centre is not None:
                self._move(rid, _Seen(t_s, centre, self._updates))

    def _move(self, rid: int, seen: _Seen) -> None:
        last, pending = self._last.get(rid), self._pending.pop(rid, None)
        if last is None or self._reaches(last, seen):
            self.glitches += pending is not None  # it came back
            self._last[rid] = seen
        elif pending is not None and self._reaches(pending, seen):
            self.jumps += 1  # it stayed away
            self._last[rid] = seen
        else:
            self._pending[rid] = seen

    def _reaches(self, a: _Seen, b: _Seen) -> bool:
        step = min(self.max_speed_m_s * (b.t_s - a.t_s), self.max_step_m)
        reach = step + self.slack_m
        return float(np.linalg.norm(b.centre - a.centre)) <= reach

    @staticmethod
    def _near(centre: np.ndarray, seen, distance: float) -> bool:
        return any(float(np.linalg.norm(centre - s.centre)) <= distance for s in seen)
