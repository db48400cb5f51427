"""Which views a rig person's keypoint is triangulated from, chosen by what the body can do:
a joint cannot jump further than a top speed allows between two instants, and a bone keeps
its length. Triangulation alone (stages/rig/triangulate.py, Pose2Sim's rule) picks the view
subset with the least reprojection error; when two views agree on a wrong elbow that subset
can win. Here a keypoint whose triangulated point breaks either rule is triangulated again
from every other subset of the views that saw it (at least min_views, each within the
reprojection bound) and the subset that keeps it moving and sized as before is taken. When
no subset does, the point stays as triangulated: nothing is dropped, and the next instant
judges it again. With `fit`, the limb joints are then fitted to the bones' median lengths
(stages/rig/bone_fit.py). Measured on Pose2Sim's single-person demo in docs/benchmarks.md
("demo_3d"); the limb-length check is stages/rig/quality.py's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations

import numpy as np

from stages.rig.bone_fit import BoneFitParams, fit_bones
from stages.rig.calibration import Camera
from stages.rig.quality import BONES
from stages.rig.triangulate import Triangulation, triangulate

SYMMETRIC = {"shoulders", "hips"}


@dataclass(frozen=True)
class ConsistencyParams:
    """max_speed_mps: a joint's top speed (12 m/s: a fast arm swing; at 60 fps 0.2 m between
    instants); bone_tolerance: a bone's length may differ from its median over the person's
    last `history` instants by this share; the median counts once `warm` lengths are in;
    max_gap_s: a joint unseen for longer has no position to move from; fit: the limb joints
    then moved toward those medians within what their views saw (stages/rig/bone_fit.py),
    None: not."""

    max_speed_mps: float = 12.0
    bone_tolerance: float = 0.2
    warm: int = 10
    history: int = 120
    max_gap_s: float = 0.25
    fit: BoneFitParams | None = None


@dataclass
class BodyPrior:
    """One rig person's joints at their last triangulation and its bones' recent lengths."""

    last: np.ndarray  # float64 [K, 3], NaN where unseen
    last_t: np.ndarray  # float64 [K] s, -inf where unseen
    lengths: dict[str, deque] = field(default_factory=dict)

    def steady(self, warm: int) -> dict[str, float]:
        """Each bone's median length over its recent instants, once it has `warm` of them."""
        return {n: float(np.median(s)) for n, s in self.lengths.items() if len(s) >= warm}


@dataclass
class Choice:
    """How many keypoints were triangulated again from another view subset, by rule, and
    how many were fitted to their bone lengths."""

    moved: int = 0  # the joint jumped past its top speed
    resized: int = 0  # a bone was off its length
    fitted: int = 0  # limb joints moved by the bone-length fit

    def __iadd__(self, other: Choice) -> Choice:
        self.moved += other.moved
        self.resized += other.resized
        self.fitted += other.fitted
        return self


@cache
def view_subsets(n_views: int, min_views: int) -> np.ndarray:
    """bool [S, V] (read-only): every subset of at least min_views of n_views views, made once
    per rig, not at every instant."""
    subsets = np.array(
        [
            [v in s for v in range(n_views)]
            for r in range(min_views, n_views + 1)
            for s in combinations(range(n_views), r)
        ]
    )
    subsets.flags.writeable = False
    return subsets


class Candidates:
    """A person's keypoints triangulated from every subset of the views that saw them: points
    [S, K, 3] (NaN where the subset has too few views or misses the reprojection bound),
    used bool [S, V], error and confidence [S, K]; computed for the keypoints asked only."""

    def __init__(
        self,
        cameras: Sequence[Camera],
        observed: np.ndarray,
        min_confidence: float,
        max_error: float,
        min_views: int,
    ) -> None:
        self.cameras = list(cameras)
        self.observed = observed  # [V, K, 3]
        self.min_confidence = min_confidence
        self.max_error = max_error
        self.min_views = min_views
        self.subsets = view_subsets(len(self.cameras), min_views)
        self._cache: dict[int, Triangulation] = {}

    def of(self, k: int) -> Triangulation:
        """Keypoint k from every subset: points [S, 1, 3] etc. (the subsets as people)."""
        if k not in self._cache:
            kp = np.repeat(self.observed[:, None, k : k + 1], len(self.subsets), axis=1)
            kp[..., 2] = np.where(self.subsets.T[..., None], kp[..., 2], 0.0)
            # each subset as it is: views left out only by the subsets themselves
            tri = triangulate(self.cameras, kp, self.min_confidence, np.inf, self.min_views)
            keep = np.isfinite(tri.error) & (tri.error <= self.max_error)
            complete = (tri.used == self.subsets[:, None, :]).all(-1)  # every view of it used
            points = np.where((keep & complete)[..., None], tri.points, np.nan)
            self._cache[k] = Triangulation(points, tri.confidence, tri.error, tri.used)
        return self._cache[k]


def _take(tri: Triangulation, p: int, k: int, cand: Triangulation, s: int) -> None:
    tri.points[p, k] = cand.points[s, 0]
    tri.confidence[p, k] = cand.confidence[s, 0]
    tri.error[p, k] = cand.error[s, 0]
    tri.used[p, k] = cand.used[s, 0]


def choose(
    prior: BodyPrior | None,
    t_s: float,
    tri: Triangulation,
    p: int,
    candidates: Candidates,
    params: ConsistencyParams,
) -> tuple[BodyPrior, Choice]:
    """Person p of tri (changed in place: points, confidence, error, used) held to its prior
    and, with params.fit, fitted to its bone lengths; the prior after this instant (a new one
    when prior is None; its lengths are the triangulated ones, before the fit, so the fit
    never feeds its own target) and what was changed."""
    n_kp = tri.points.shape[1]
    if prior is None:
        prior = BodyPrior(np.full((n_kp, 3), np.nan), np.full(n_kp, -np.inf))
    choice = Choice()
    dt = t_s - prior.last_t
    recent = np.isfinite(prior.last).all(-1) & (dt > 0) & (dt <= params.max_gap_s)
    reach = params.max_speed_mps * np.where(recent, dt, 0.0)
    points = tri.points[p]
    jumped = recent & np.isfinite(points).all(-1)
    jumped &= np.linalg.norm(np.where(jumped[:, None], points - prior.last, 0.0), axis=-1) > reach
    for k in np.flatnonzero(jumped):
        cand = candidates.of(int(k))
        gone = np.linalg.norm(cand.points[:, 0] - prior.last[k], axis=-1)
        gone = np.where(np.isfinite(gone), gone, np.inf)
        s = int(gone.argmin())
        if gone[s] <= reach[k]:
            _take(tri, p, int(k), cand, s)
            choice.moved += 1
    steady = prior.steady(params.warm)
    for name, distal, proximal in BONES:
        length = np.linalg.norm(points[distal] - points[proximal])
        if name not in steady or not np.isfinite(length):
            continue
        median = steady[name]
        if abs(length - median) <= params.bone_tolerance * median:
            continue
        ends = (distal, proximal) if name in SYMMETRIC else (distal,)
        best: tuple[float, int, int] | None = None
        for end in ends:
            other = proximal if end == distal else distal
            cand = candidates.of(end)
            off = np.abs(np.linalg.norm(cand.points[:, 0] - points[other], axis=-1) - median)
            off = np.where(np.isfinite(off), off, np.inf)
            s = int(off.argmin())
            if best is None or off[s] < best[0]:
                best = (float(off[s]), end, s)
        if best is not None and best[0] <= params.bone_tolerance * median:
            _take(tri, p, best[1], candidates.of(best[1]), best[2])
            choice.resized += 1
    for name, distal, proximal in BONES:
        length = np.linalg.norm(points[distal] - points[proximal])
        if np.isfinite(length):
            prior.lengths.setdefault(name, deque(maxlen=params.history)).append(float(length))
    if params.fit is not None:
        choice.fitted += fit_bones(
            candidates.cameras,
            candidates.observed,
            tri,
            p,
            steady,
            params.fit,
            candidates.max_error,
        )
    seen_now = np.isfinite(points).all(-1)
    prior.last = np.where(seen_now[:, None], points, prior.last)
    prior.last_t = np.where(seen_now, t_s, prior.last_t)
    return prior, choice


def hold_clip(
    cameras: Sequence[Camera],
    keypoints: np.ndarray,
    tri: Triangulation,
    fps: float,
    params: ConsistencyParams,
    min_confidence: float,
    max_error: float,
    min_views: int,
) -> Choice:
    """One person's clip held as the rig3d stage holds a rig person, instant by instant (in
    place): keypoints float [V, T, K, 3], tri their triangulation with the T instants as its
    people, instant t at t / fps s. How many keypoints were triangulated again."""
    prior, total = None, Choice()
    for t in range(tri.points.shape[0]):
        candidates = Candidates(cameras, keypoints[:, t], min_confidence, max_error, min_views)
        prior, choice = choose(prior, t / fps, tri, t, candidates, params)
        total += choice
    return total
