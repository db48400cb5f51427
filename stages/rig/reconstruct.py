"""One rig instant's 2D people -> 3D people: cross-view association (stages.rig.associate),
clusters of one rig person joined again and rig person ids kept through the 2D tracks
(RigPersonIds), optionally left/right swaps of a view
undone (stages.rig.sides), triangulation of every keypoint (stages.rig.triangulate),
optionally the view subsets of keypoints that break a rig person's top speed or bone lengths
chosen again (stages.rig.consistency) and a One Euro filter per rig person
(stages.rig.filter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stages.rig.associate import MAX_COST_PX, RigPersonIds, associate
from stages.rig.associate import MIN_CONFIDENCE as ASSOCIATE_MIN_CONFIDENCE
from stages.rig.calibration import Camera
from stages.rig.consistency import BodyPrior, Candidates, Choice, ConsistencyParams, choose
from stages.rig.filter import OneEuroFilter
from stages.rig.quality import RecentResiduals
from stages.rig.sides import MIRROR, unswap_views
from stages.rig.triangulate import (
    MAX_ERROR_PX,
    MIN_CONFIDENCE,
    MIN_VIEWS,
    Triangulation,
    triangulate,
)


@dataclass(frozen=True)
class View2D:
    """One camera's 2D people at the instant: track ids [N] and keypoints float [N, K, 3]
    (x px, y px, score)."""

    track_ids: tuple[int, ...]
    keypoints: np.ndarray


@dataclass(frozen=True)
class People3D:
    """ids [P] rig person ids; tracks[p]: camera -> 2D track id of person p's views;
    points float64 [P, K, 3] world (m, NaN where not triangulated); confidence float32
    [P, K]; error float32 [P, K] px (NaN where not triangulated); used bool [P, K, V], the
    views (rig camera order) each point came from; filtered: the points went through the
    temporal filter."""

    ids: tuple[int, ...]
    tracks: tuple[dict[str, int], ...]
    points: np.ndarray
    confidence: np.ndarray
    error: np.ndarray
    used: np.ndarray
    filtered: bool


@dataclass(frozen=True)
class FilterParams:
    """OneEuroFilter's parameters (docs/rig.md: latency 1 / (2 pi fc))."""

    min_cutoff: float = 1.0
    beta: float = 1.0
    d_cutoff: float = 1.0


class Reconstructor:
    """A rig's 3D people over time. cameras: the rig's calibrated cameras, in rig order (by
    their names); person ids and filter states persist across calls."""

    def __init__(
        self,
        cameras: Sequence[Camera],
        min_confidence: float = MIN_CONFIDENCE,
        max_error_px: float = MAX_ERROR_PX,
        min_views: int = MIN_VIEWS,
        max_association_px: float = MAX_COST_PX,
        person_max_age: int = 30,
        filter_params: FilterParams | None = None,
        swap_sides: bool = False,
        consistency: ConsistencyParams | None = None,
    ) -> None:
        self.cameras = list(cameras)
        self.names = [c.name for c in self.cameras]
        self.min_confidence = min_confidence
        self.max_error_px = max_error_px
        self.min_views = min_views
        self.max_association_px = max_association_px
        self.person_max_age = person_max_age
        self.ids = RigPersonIds(person_max_age)
        self.filter_params = filter_params
        self.swap_sides = swap_sides
        self.swapped_views = 0  # views of a person mirrored by swap_sides, since the start
        self.consistency = consistency
        self.chosen = Choice()  # keypoints triangulated again by the consistency rules
        self.residuals = RecentResiduals(self.cameras)  # per view, before the filter
        self._priors: dict[int, tuple[BodyPrior, int]] = {}  # id -> (prior, update)
        self._filters: dict[int, tuple[OneEuroFilter, float, int]] = {}  # id -> (f, t, update)
        self._updates = 0

    def __call__(self, t_s: float, views: Mapping[str, View2D], keypoints: int) -> People3D:
        """views: camera name -> its 2D people at capture time t_s (s, increasing between
        calls), each with `keypoints` keypoints; cameras without a view saw nobody or were
        missing."""
        k = keypoints
        people = [
            np.asarray(views[n].keypoints, np.float64).reshape(-1, k, 3)
            if n in views
            else np.zeros((0, k, 3))
            for n in self.names
        ]
        track_ids = [list(views[n].track_ids) if n in views else [] for n in self.names]
        sides = self.swap_sides and k == len(MIRROR)  # the 308 keypoints, whose sides are named
        clusters = associate(
            self.cameras,
            people,
            max_cost=self.max_association_px,
            min_confidence=max(ASSOCIATE_MIN_CONFIDENCE, self.min_confidence),
            min_views=self.min_views,
            mirror=MIRROR if sides else None,
        )
        clusters = self.ids.merge(clusters, track_ids)
        ids = self.ids.update(clusters, track_ids)
        n_views = len(self.cameras)
        observed = np.full((n_views, len(clusters), k, 3), np.nan)
        for p, cluster in enumerate(clusters):
            for v, i in cluster.items():
                observed[v, p] = people[v][i]
        if sides:
            observed, swapped = unswap_views(
                self.cameras,
                observed,
                min_confidence=self.min_confidence,
                max_error=self.max_error_px,
            )
            self.swapped_views += int(swapped.sum())
        tri = triangulate(
            self.cameras, observed, self.min_confidence, self.max_error_px, self.min_views
        )
        self._updates += 1
        if self.consistency is not None and k == len(MIRROR):  # the 308 named keypoints
            for p, rid in enumerate(ids):
                self._hold(rid, t_s, tri, p, observed[:, p])
        self.residuals.add(tri.points, observed, tri.used)
        points = tri.points
        if self.filter_params is not None and len(ids):
            points = np.stack([self._filter(rid, t_s, points[p]) for p, rid in enumerate(ids)])
        self._prune()
        tracks = tuple(
            {self.names[v]: int(track_ids[v][i]) for v, i in cluster.items()}
            for cluster in clusters
        )
        return People3D(
            tuple(ids),
            tracks,
            points,
            tri.confidence,
            tri.error,
            tri.used,
            self.filter_params is not None,
        )

    def _filter(self, rid: int, t_s: float, points: np.ndarray) -> np.ndarray:
        state = self._filters.get(rid)
        if state is None or not t_s > state[1]:
            p = self.filter_params
            state = (OneEuroFilter(p.min_cutoff, p.beta, p.d_cutoff), t_s, self._updates)
        f = state[0]
        out = f(t_s, points)
        self._filters[rid] = (f, t_s, self._updates)
        return out

    def _hold(self, rid: int, t_s: float, tri: Triangulation, p: int, observed: np.ndarray) -> None:
        """Person p of tri held to rig person rid's top speed and bone lengths (in place)."""
        assert self.consistency is not None
        state = self._priors.get(rid)
        candidates = Candidates(
            self.cameras, observed, self.min_confidence, self.max_error_px, self.min_views
        )
        prior, choice = choose(
            state[0] if state else None, t_s, tri, p, candidates, self.consistency
        )
        self._priors[rid] = (prior, self._updates)
        self.chosen += choice

    def _prune(self) -> None:
        """Forget the filter and the prior of a rig person unseen for person_max_age updates."""
        old = [r for r, s in self._filters.items() if self._updates - s[2] >= self.person_max_age]
        for rid in old:
            del self._filters[rid]
        old = [r for r, s in self._priors.items() if self._updates - s[1] >= self.person_max_age]
        for rid in old:
            del self._priors[rid]
