"""Which 2D person in each camera is the same person: epipolar consistency of their keypoints,
clustered across views, and a rig-level person id kept over time through the 2D track ids.

Pair cost: the median over keypoints confident in both views of the symmetric epipolar distance
(px, undistorted: each point's distance to the epipolar line of its match, averaged over the
two images), from the essential matrix of the two calibrated cameras. Clusters: pairs within
the gate merged cheapest first, at most one person per camera, and no scored cross pair of a
merge above the gate (greedy agglomerative matching over the pairwise affinities).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import combinations

import numpy as np

from pipeline.errors import NpucamError
from stages.rig.calibration import Camera

MAX_COST_PX = 20.0  # gate on a pair's median epipolar distance
MIN_CONFIDENCE = 0.3
MIN_SHARED = 10  # keypoints confident in both views needed to score a pair
MAX_PEOPLE = 64  # per camera: a pair costs O(Na Nb K)


class AssociationError(NpucamError):
    """People arrays association cannot use; names the camera."""


def _essential(a: Camera, b: Camera) -> np.ndarray:
    """float64 [3, 3] E with x_b^T E x_a = 0 for normalized points of one world point."""
    r = b.extrinsics[:, :3] @ a.extrinsics[:, :3].T
    t = b.translation - r @ a.translation
    skew = np.array([[0, -t[2], t[1]], [t[2], 0, -t[0]], [-t[1], t[0], 0]])
    return skew @ r


def _normalized(cam: Camera, people: np.ndarray, min_confidence: float):
    """people [N, K, 3] -> (homogeneous normalized points [N, K, 3], confident bool [N, K])."""
    ok = np.isfinite(people).all(-1) & (people[..., 2] >= min_confidence)
    pts = cam.normalize(np.where(ok[..., None], people[..., :2], 0.0).reshape(-1, 2))
    pts = np.concatenate([pts, np.ones((len(pts), 1))], 1).reshape(*people.shape[:2], 3)
    return pts, ok


def pair_costs(
    a: Camera,
    b: Camera,
    people_a: np.ndarray,
    people_b: np.ndarray,
    min_confidence: float = MIN_CONFIDENCE,
    min_shared: int = MIN_SHARED,
) -> np.ndarray:
    """people_a [Na, K, 3], people_b [Nb, K, 3] (x px, y px, confidence) -> float64 [Na, Nb]
    median symmetric epipolar distance in px; inf under min_shared common keypoints."""
    xa, ok_a = _normalized(a, people_a, min_confidence)
    xb, ok_b = _normalized(b, people_b, min_confidence)
    e = _essential(a, b)
    line_b = xa @ e.T  # [Na, K, 3]: epipolar lines in b of a's points
    line_a = xb @ e  # [Nb, K, 3]: epipolar lines in a of b's points
    algebraic = np.abs(np.einsum("bki,aki->abk", xb, line_b))  # x_b^T E x_a, [Na, Nb, K]
    with np.errstate(divide="ignore", invalid="ignore"):
        dist_b = algebraic / np.hypot(line_b[..., 0], line_b[..., 1])[:, None] * b.focal
        dist_a = algebraic / np.hypot(line_a[..., 0], line_a[..., 1])[None] * a.focal
    both = ok_a[:, None] & ok_b[None]
    dist = np.where(both, (dist_a + dist_b) / 2, np.inf)
    dist = np.sort(dist, -1)
    n = both.sum(-1)
    lo = np.take_along_axis(dist, np.maximum(n - 1, 0)[..., None] // 2, -1)[..., 0]
    hi = np.take_along_axis(dist, (n // 2)[..., None], -1)[..., 0]
    return np.where(n >= min_shared, (lo + hi) / 2, np.inf)


def associate(
    cameras: Sequence[Camera],
    people: Sequence[np.ndarray],
    max_cost: float = MAX_COST_PX,
    min_confidence: float = MIN_CONFIDENCE,
    min_views: int = 2,
    mirror: np.ndarray | None = None,
) -> list[dict[int, int]]:
    """people[v]: float [N_v, K, 3] camera v's 2D people. Returns the clusters seen by at
    least min_views cameras, each {view: person index in that view}, in order of their
    lowest (view, index). With mirror (int [K], each keypoint's other-side counterpart,
    stages.rig.sides.MIRROR) a pair also scores with one view's sides exchanged, the lower
    cost counting: a view whose 2D model swapped a person's sides still joins them."""
    if len(people) != len(cameras):
        raise AssociationError(f"{len(people)} people arrays for {len(cameras)} cameras")
    arrays = []
    for cam, p in zip(cameras, people, strict=True):
        p = np.asarray(p, dtype=np.float64)
        if p.ndim != 3 or p.shape[2] != 3 or (arrays and p.shape[1] != arrays[0].shape[1]):
            raise AssociationError(
                f"camera {cam.name!r}: people must be [N, K, 3] with one K for all cameras, "
                f"got {p.shape}"
            )
        if len(p) > MAX_PEOPLE:
            raise AssociationError(f"camera {cam.name!r}: {len(p)} people, at most {MAX_PEOPLE}")
        arrays.append(p)
    cost_of = {}  # scored pairs; a pair without enough common keypoints has no say
    for va, vb in combinations(range(len(cameras)), 2):
        if len(arrays[va]) and len(arrays[vb]):
            cost = pair_costs(cameras[va], cameras[vb], arrays[va], arrays[vb], min_confidence)
            if mirror is not None:
                flipped = arrays[vb][:, mirror]
                swapped = pair_costs(cameras[va], cameras[vb], arrays[va], flipped, min_confidence)
                cost = np.fmin(cost, swapped)
            for i, j in zip(*np.nonzero(np.isfinite(cost)), strict=True):
                cost_of[frozenset(((va, int(i)), (vb, int(j))))] = float(cost[i, j])
    edges = sorted((c, *sorted(pair)) for pair, c in cost_of.items() if c <= max_cost)
    cluster = {(v, i): {(v, i)} for v, p in enumerate(arrays) for i in range(len(p))}
    for _, a, b in edges:
        ca, cb = cluster[a], cluster[b]
        if ca is cb or {v for v, _ in ca} & {v for v, _ in cb}:
            continue
        if all(cost_of.get(frozenset((x, y)), 0.0) <= max_cost for x in ca for y in cb):
            merged = ca | cb
            for member in merged:
                cluster[member] = merged
    unique = {id(c): c for c in cluster.values()}.values()
    out = [dict(sorted(c)) for c in unique if len(c) >= min_views]
    return sorted(out, key=lambda c: min(c.items()))


class RigPersonIds:
    """Rig-level person ids kept over time through each camera's 2D track ids: a cluster takes
    the id most of its (camera, track) members had, so an id persists while its tracks do and
    survives a track change in some of its views; a cluster of only new tracks gets a new id.
    A (camera, track) unseen for max_age updates is forgotten."""

    def __init__(self, max_age: int = 30) -> None:
        self.max_age = max_age
        self._frame = 0
        self._next = 0
        self._id_of: dict[tuple[int, int], tuple[int, int]] = {}  # (view, track) -> (id, frame)

    def merge(
        self, clusters: Sequence[dict[int, int]], track_ids: Sequence[Sequence[int]]
    ) -> list[dict[int, int]]:
        """clusters with the clusters joined whose members all had one rig id, the same, at
        the last update and whose views are disjoint: one person that association split this
        instant (a pair of its views disagreed beyond max_cost) stays one person, with all its
        views, rather than one part taking a new id. Order: each joined cluster at its first
        part's place."""
        out: list[dict[int, int]] = []
        by_id: dict[int, int] = {}  # rig id -> index in out of the cluster that holds it
        for c in clusters:
            had = {self._id_of.get((v, int(track_ids[v][i])), (None,))[0] for v, i in c.items()}
            rid = next(iter(had)) if len(had) == 1 else None
            j = by_id.get(rid) if rid is not None else None
            if j is not None and not out[j].keys() & c.keys():
                out[j] = dict(sorted({**out[j], **c}.items()))
                continue
            if rid is not None and j is None:
                by_id[rid] = len(out)
            out.append(dict(c))
        return out

    def update(
        self, clusters: Sequence[dict[int, int]], track_ids: Sequence[Sequence[int]]
    ) -> list[int]:
        """clusters from associate; track_ids[v][i]: the 2D track id of person i of view v.
        Returns one rig person id per cluster."""
        self._frame += 1
        keys = [[(v, int(track_ids[v][i])) for v, i in c.items()] for c in clusters]
        votes = []
        for n, members in enumerate(keys):
            count = Counter(self._id_of[m][0] for m in members if m in self._id_of)
            votes += [(-k, n, rid) for rid, k in count.items()]
        ids: list[int | None] = [None] * len(clusters)
        taken = set()
        for _, n, rid in sorted(votes):
            if ids[n] is None and rid not in taken:
                ids[n] = rid
                taken.add(rid)
        for n, members in enumerate(keys):
            if ids[n] is None:
                ids[n] = self._next
                self._next += 1
            for m in members:
                self._id_of[m] = (ids[n], self._frame)
        self._id_of = {m: v for m, v in self._id_of.items() if self._frame - v[1] < self.max_age}
        return ids
