"""Per-camera person tracker, ByteTrack-style, and the pose-refresh order it gives the scheduler.

Matches ByteTrack's association (Zhang et al., 2022; as in roboflow/supervision's ByteTrack):
high-score boxes first match every live or lost track by IoU (ByteTrack's lapjv assignment
with a cost limit, solved per group of overlapping boxes), then low-score boxes may only
extend the still-unmatched live tracks, never start one; tracks unmatched for longer than
the lost buffer expire, and ids are never reused. A camera keeps at most max_tracks tracks.
A frame time before the previous one (a clock stepped back) is a clock jump: counted,
logged, and the tracker's times move with it, so the camera goes on tracking. Motion is a
constant-velocity prediction of the box corners (px/s) instead of ByteTrack's Kalman filter.
Each track remembers when its pose was last refreshed, so pose jobs go to the oldest pose
first and N people share the device fairly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from pipeline.errors import NpucamError

log = logging.getLogger(__name__)

_NS = 1_000_000_000
MAX_TRACKS = 256  # tracks (live and lost) per camera; detect's tracker.max_tracks
JUMPS_LOGGED = 5  # clock jumps logged per camera; then one line per 100


class TrackerError(NpucamError):
    """Detections or timestamps the tracker cannot accept; names the camera."""


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU. a: float [N, 4], b: float [M, 4], boxes (x1, y1, x2, y2) -> float64 [N, M]."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def linear_assignment(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost assignment of min(N, M) pairs: scipy.optimize.linear_sum_assignment (a
    shortest-augmenting-path solver in C). cost: float [N, M]. Returns (rows, cols), int64
    [min(N, M)], rows ascending."""
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2:
        raise ValueError(f"cost must be 2-D, got shape {cost.shape}")
    rows, cols = linear_sum_assignment(cost)
    return rows.astype(np.int64), cols.astype(np.int64)


def match_by_iou(iou: np.ndarray, min_iou: float) -> list[tuple[int, int]]:
    """Pairs (row, col) of ByteTrack's assignment (lap.lapjv with extend_cost and cost_limit
    1 - min_iou): the matching that minimises the sum of 1 - IoU over matched pairs plus
    (1 - min_iou) / 2 for every row and column left unmatched, so no pair below min_iou is
    ever matched. Sorted by row.

    Only pairs with IoU >= min_iou can match, so the problem splits into the connected
    components of those pairs, each solved on its own: boxes far from every track cost
    nothing, and the work is that of the largest group of mutually overlapping boxes
    (the detect stage bounds the boxes per frame: boxes_max_per_message, tracker.max_tracks).
    """
    iou = np.asarray(iou, dtype=np.float64)
    n, m = iou.shape
    rows, cols = np.nonzero(iou >= min_iou)
    if rows.size == 0:
        return []
    graph = coo_matrix((np.ones(rows.size), (rows, n + cols)), shape=(n + m, n + m))
    _, label = connected_components(graph, directed=False)
    limit = 1.0 - min_iou
    out: list[tuple[int, int]] = []
    for comp in np.unique(label[rows]):
        r = np.nonzero(label[:n] == comp)[0]
        c = np.nonzero(label[n:] == comp)[0]
        if len(r) == 1 and len(c) == 1:
            out.append((int(r[0]), int(c[0])))
            continue
        out.extend(_extended_assignment(iou[np.ix_(r, c)], min_iou, limit, r, c))
    out.sort()
    return out


def _extended_assignment(
    sub: np.ndarray, min_iou: float, limit: float, r: np.ndarray, c: np.ndarray
) -> list[tuple[int, int]]:
    """One component of match_by_iou: the square extended problem of lapjv's extend_cost,
    [[C, U_rows], [U_cols, 0]] with C = 1 - IoU (forbidden below min_iou) and U the
    cost_limit / 2 of leaving a row or a column unmatched (diagonal, else forbidden)."""
    nr, nc = sub.shape
    forbidden = 1e6  # larger than any feasible total: nr + nc items at cost <= 1 each
    big = np.full((nr + nc, nc + nr), forbidden)
    big[:nr, :nc] = np.where(sub >= min_iou, 1.0 - sub, forbidden)
    big[np.arange(nr), nc + np.arange(nr)] = limit / 2
    big[nr + np.arange(nc), np.arange(nc)] = limit / 2
    big[nr:, nc:] = 0.0
    rr, cc = linear_sum_assignment(big)
    keep = (rr < nr) & (cc < nc)
    return [
        (int(r[i]), int(c[j]))
        for i, j in zip(rr[keep], cc[keep], strict=True)
        if sub[i, j] >= min_iou
    ]


@dataclass(slots=True)
class Track:
    """One tracked person. box: float64 [4] (x1, y1, x2, y2) at last_seen_ns; velocity: px/s."""

    track_id: int
    box: np.ndarray
    score: float
    velocity: np.ndarray
    last_seen_ns: int
    hits: int = 1
    lost: bool = False
    pose_ts_ns: int | None = None  # capture time of the frame its latest pose came from
    pose_running: bool = False

    def predicted(self, at_ns: int) -> np.ndarray:
        """The box extrapolated at constant velocity to at_ns: float64 [4]."""
        return self.box + self.velocity * ((at_ns - self.last_seen_ns) / _NS)

    @property
    def pose_priority(self) -> int:
        """Scheduler priority of its pose job (lower first): never-posed tracks first, then
        the oldest pose."""
        return -1 if self.pose_ts_ns is None else self.pose_ts_ns


@dataclass(frozen=True, slots=True)
class TrackedBox:
    """A detection with its track id. box: float32 [4]; detection: index in update's input."""

    track_id: int
    box: np.ndarray
    score: float
    detection: int


@dataclass(frozen=True, slots=True)
class PoseTag:
    """What a pose result carries about its track: the capture time of the frame the pose
    came from, its age at publish time, and the time since the track's previous pose;
    tracked is False when the track had expired before its pose finished (the tracker no
    longer knows its previous pose, so since_previous_ns is None)."""

    track_id: int
    capture_ts_ns: int
    age_ns: int
    since_previous_ns: int | None
    tracked: bool = True


class PersonTracker:
    """ByteTrack-style association for one camera; call `update` once per frame, in order.

    high_score / low_score: detection score split of ByteTrack's two stages (below low_score
    a box is ignored); new_track_score: a high box must score this to start a track;
    match_iou / low_match_iou: IoU gates of the two stages (ByteTrack: 1 - 0.8 and 0.5);
    lost_buffer_s: how long an unmatched track is kept for re-identification; max_tracks:
    live and lost tracks kept (a new one at the cap replaces the lost track seen longest ago,
    or is not started when every track is live: counted in tracks_refused). clock_jumps
    counts frames whose time was before the previous frame's.
    """

    def __init__(
        self,
        camera: str,
        *,
        high_score: float = 0.5,
        low_score: float = 0.1,
        new_track_score: float = 0.6,
        match_iou: float = 0.2,
        low_match_iou: float = 0.5,
        lost_buffer_s: float = 1.0,
        velocity_alpha: float = 0.5,
        max_tracks: int = MAX_TRACKS,
    ) -> None:
        if not 0 <= low_score <= high_score <= new_track_score <= 1:
            raise TrackerError(
                f"camera {camera!r}: tracker needs 0 <= low_score <= high_score <= "
                f"new_track_score <= 1, got {low_score}, {high_score}, {new_track_score}"
            )
        if lost_buffer_s < 0:
            raise TrackerError(f"camera {camera!r}: lost_buffer_s must be >= 0")
        if max_tracks < 1:
            raise TrackerError(f"camera {camera!r}: max_tracks must be >= 1")
        self.camera = camera
        self.high_score = high_score
        self.low_score = low_score
        self.new_track_score = new_track_score
        self.match_iou = match_iou
        self.low_match_iou = low_match_iou
        self.lost_buffer_ns = round(lost_buffer_s * _NS)
        self.velocity_alpha = velocity_alpha
        self.max_tracks = max_tracks
        self.clock_jumps = 0
        self.last_jump_ns = 0  # the latest jump: new frame time - previous frame time (< 0)
        self.tracks_refused = 0
        self._tracks: dict[int, Track] = {}
        self._next_id = 1
        self._last_ts: int | None = None

    @property
    def tracks(self) -> list[Track]:
        """Tracks matched in the latest frame, by id."""
        return [t for t in self._tracks.values() if not t.lost]

    @property
    def lost_tracks(self) -> list[Track]:
        """Tracks kept in the lost buffer, by id."""
        return [t for t in self._tracks.values() if t.lost]

    def track(self, track_id: int) -> Track | None:
        """A live or lost track by id (None once expired)."""
        return self._tracks.get(track_id)

    def update(self, boxes: np.ndarray, scores: np.ndarray, ts_ns: int) -> list[TrackedBox]:
        """Associate one frame's person detections. boxes: float [N, 4] (x1, y1, x2, y2) px;
        scores: float [N]; ts_ns: the frame's capture time (a time before the previous
        frame's is a clock jump, see the class docstring). Returns the detections that belong
        to a track, in detection order."""
        boxes, scores = self._check(boxes, scores)
        if self._last_ts is not None and ts_ns < self._last_ts:
            self._clock_jumped(ts_ns - self._last_ts)
        self._last_ts = ts_ns
        high = np.nonzero(scores >= self.high_score)[0]
        low = np.nonzero((scores >= self.low_score) & (scores < self.high_score))[0]
        out: list[TrackedBox] = []

        candidates = list(self._tracks.values())
        predicted = np.array([t.predicted(ts_ns) for t in candidates]).reshape(-1, 4)
        matched_tracks: set[int] = set()
        matched_high: set[int] = set()
        for r, c in match_by_iou(iou_matrix(predicted, boxes[high]), self.match_iou):
            self._refresh(candidates[r], boxes[high[c]], float(scores[high[c]]), ts_ns)
            matched_tracks.add(candidates[r].track_id)
            matched_high.add(int(high[c]))
            out.append(self._tagged(candidates[r], int(high[c])))

        # ByteTrack's second stage: low boxes only extend live tracks still unmatched.
        remaining = [t for t in candidates if t.track_id not in matched_tracks and not t.lost]
        remaining_pred = np.array([t.predicted(ts_ns) for t in remaining]).reshape(-1, 4)
        for r, c in match_by_iou(iou_matrix(remaining_pred, boxes[low]), self.low_match_iou):
            self._refresh(remaining[r], boxes[low[c]], float(scores[low[c]]), ts_ns)
            matched_tracks.add(remaining[r].track_id)
            out.append(self._tagged(remaining[r], int(low[c])))

        for track in candidates:
            if track.track_id in matched_tracks:
                continue
            track.lost = True
            if ts_ns - track.last_seen_ns > self.lost_buffer_ns:
                del self._tracks[track.track_id]

        for i in high:
            if int(i) in matched_high or scores[i] < self.new_track_score:
                continue
            if len(self._tracks) >= self.max_tracks and not self._evict_lost():
                self.tracks_refused += 1
                continue
            track = Track(
                track_id=self._next_id,
                box=boxes[i].copy(),
                score=float(scores[i]),
                velocity=np.zeros(4),
                last_seen_ns=ts_ns,
            )
            self._next_id += 1
            self._tracks[track.track_id] = track
            out.append(self._tagged(track, int(i)))
        out.sort(key=lambda tb: tb.detection)
        return out

    def _clock_jumped(self, delta_ns: int) -> None:
        """The frame clock stepped back by -delta_ns: move every stored time by delta_ns, as
        if no time had passed since the previous frame (predictions stay put, lost tracks
        keep their remaining buffer, pose ages stay in order)."""
        self.clock_jumps += 1
        self.last_jump_ns = delta_ns
        for track in self._tracks.values():
            track.last_seen_ns += delta_ns
            if track.pose_ts_ns is not None:
                track.pose_ts_ns += delta_ns
        if self.clock_jumps <= JUMPS_LOGGED or self.clock_jumps % 100 == 0:
            log.warning(
                "camera %r: frame time %.3f s before the previous frame's (a clock jump, %d so "
                "far): tracking goes on from the new time",
                self.camera,
                -delta_ns / _NS,
                self.clock_jumps,
            )

    def _evict_lost(self) -> bool:
        """Drop the lost track seen longest ago to make room; False if every track is live."""
        lost = [t for t in self._tracks.values() if t.lost]
        if not lost:
            return False
        del self._tracks[min(lost, key=lambda t: (t.last_seen_ns, t.track_id)).track_id]
        return True

    def _check(self, boxes: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        where = f"camera {self.camera!r}"
        boxes = np.asarray(boxes, dtype=np.float64)
        scores = np.asarray(scores, dtype=np.float64)
        if boxes.size == 0:
            boxes = boxes.reshape(0, 4)
        if boxes.ndim != 2 or boxes.shape[1] != 4:
            raise TrackerError(f"{where}: boxes must be [N, 4], got shape {boxes.shape}")
        if scores.shape != (boxes.shape[0],):
            raise TrackerError(
                f"{where}: scores must be [{boxes.shape[0]}], got shape {scores.shape}"
            )
        if not (np.isfinite(boxes).all() and np.isfinite(scores).all()):
            raise TrackerError(f"{where}: boxes or scores contain NaN or inf")
        bad = np.nonzero((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1]))[0]
        if bad.size:
            raise TrackerError(f"{where}: box {int(bad[0])} has x2 < x1 or y2 < y1")
        return boxes, scores

    def _refresh(self, track: Track, box: np.ndarray, score: float, ts_ns: int) -> None:
        dt = (ts_ns - track.last_seen_ns) / _NS
        if dt > 0:
            seen = (box - track.box) / dt
            a = self.velocity_alpha
            track.velocity = seen if track.hits == 1 else a * seen + (1 - a) * track.velocity
        track.box = box.copy()
        track.score = score
        track.last_seen_ns = ts_ns
        track.hits += 1
        track.lost = False

    @staticmethod
    def _tagged(track: Track, detection: int) -> TrackedBox:
        return TrackedBox(track.track_id, track.box.astype(np.float32), track.score, detection)

    # -- pose refresh order -----------------------------------------------------------------

    def pose_queue(self, limit: int | None = None) -> list[Track]:
        """Live tracks without a pose running, oldest pose first (never-posed first, then by
        pose time, then id): submit their pose jobs in this order with `pose_priority`."""
        ready = [t for t in self.tracks if not t.pose_running]
        ready.sort(key=lambda t: (t.pose_priority, t.track_id))
        return ready if limit is None else ready[:limit]

    def pose_started(self, track_id: int) -> None:
        """Its pose job went to the device: no new pose job for it until it finishes."""
        track = self._tracks.get(track_id)
        if track is not None:
            track.pose_running = True

    def pose_finished(self, track_id: int, capture_ts_ns: int | None, at_ns: int) -> PoseTag | None:
        """Its pose job ended: with the capture time of the frame it used (a result) or None
        (failed or dropped). Returns the tag a published pose carries, if there is one."""
        track = self._tracks.get(track_id)
        if track is not None:
            track.pose_running = False
        if capture_ts_ns is None:
            return None
        previous = None if track is None else track.pose_ts_ns
        # a frame is never later than the newest one tracked (one from before a clock jump
        # would otherwise look fresh for as long as the jump)
        posed = capture_ts_ns if self._last_ts is None else min(capture_ts_ns, self._last_ts)
        if track is not None and (previous is None or posed > previous):
            track.pose_ts_ns = posed
        return PoseTag(
            track_id=track_id,
            capture_ts_ns=capture_ts_ns,
            age_ns=at_ns - capture_ts_ns,
            since_previous_ns=None if previous is None else capture_ts_ns - previous,
            tracked=track is not None,
        )
