"""Per-camera person tracker, ByteTrack-style, and the pose-refresh order it gives the scheduler.

Matches ByteTrack's association (Zhang et al., 2022; as in roboflow/supervision's ByteTrack):
high-score boxes first match every live or lost track by IoU (Hungarian assignment), then
low-score boxes may only extend the still-unmatched live tracks, never start one; tracks
unmatched for longer than the lost buffer expire, and ids are never reused. Motion is a
constant-velocity prediction of the box corners (px/s) instead of ByteTrack's Kalman filter.
Each track remembers when its pose was last refreshed, so pose jobs go to the oldest pose
first and N people share the device fairly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.errors import NpucamError

_NS = 1_000_000_000
_GATED = 2.0  # assignment cost of a pair below the IoU gate; real costs (1 - IoU) are < 1


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
    """Minimum-cost assignment of min(N, M) pairs, as scipy.optimize.linear_sum_assignment.

    cost: float [N, M]. Returns (rows, cols), int64 [min(N, M)], rows ascending. Hungarian
    method with potentials and shortest augmenting paths, O(N^2 M).
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2:
        raise ValueError(f"cost must be 2-D, got shape {cost.shape}")
    transposed = cost.shape[0] > cost.shape[1]
    if transposed:
        cost = cost.T
    n, m = cost.shape
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    u = np.zeros(n + 1)
    v = np.zeros(m + 1)
    row_of = np.zeros(m + 1, dtype=np.int64)  # column j (1-based) -> row (1-based), 0 = free
    way = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        row_of[0] = i
        j0 = 0
        minv = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = row_of[j0]
            free = ~used[1:]
            reduced = cost[i0 - 1] - u[i0] - v[1:]
            better = free & (reduced < minv[1:])
            minv[1:][better] = reduced[better]
            way[1:][better] = j0
            masked = np.where(free, minv[1:], np.inf)
            j1 = int(np.argmin(masked)) + 1
            delta = masked[j1 - 1]
            u[row_of[used]] += delta
            v[used] -= delta
            minv[~used] -= delta
            j0 = j1
            if row_of[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            row_of[j0] = row_of[j1]
            j0 = j1
    cols = np.nonzero(row_of[1:])[0]
    rows = row_of[1:][cols] - 1
    if transposed:
        rows, cols = cols, rows
    order = np.argsort(rows)
    return rows[order].astype(np.int64), cols[order].astype(np.int64)


def match_by_iou(iou: np.ndarray, min_iou: float) -> list[tuple[int, int]]:
    """Pairs (row, col) of an optimal assignment on 1 - IoU, keeping only IoU >= min_iou."""
    if iou.size == 0:
        return []
    cost = np.where(iou >= min_iou, 1.0 - iou, _GATED)
    rows, cols = linear_assignment(cost)
    return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if iou[r, c] >= min_iou]


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
    lost_buffer_s: how long an unmatched track is kept for re-identification.
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
    ) -> None:
        if not 0 <= low_score <= high_score <= new_track_score <= 1:
            raise TrackerError(
                f"camera {camera!r}: tracker needs 0 <= low_score <= high_score <= "
                f"new_track_score <= 1, got {low_score}, {high_score}, {new_track_score}"
            )
        if lost_buffer_s < 0:
            raise TrackerError(f"camera {camera!r}: lost_buffer_s must be >= 0")
        self.camera = camera
        self.high_score = high_score
        self.low_score = low_score
        self.new_track_score = new_track_score
        self.match_iou = match_iou
        self.low_match_iou = low_match_iou
        self.lost_buffer_ns = round(lost_buffer_s * _NS)
        self.velocity_alpha = velocity_alpha
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
        scores: float [N]; ts_ns: the frame's capture time (non-decreasing). Returns the
        detections that belong to a track, in detection order."""
        boxes, scores = self._check(boxes, scores, ts_ns)
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

    def _check(
        self, boxes: np.ndarray, scores: np.ndarray, ts_ns: int
    ) -> tuple[np.ndarray, np.ndarray]:
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
        if self._last_ts is not None and ts_ns < self._last_ts:
            raise TrackerError(
                f"{where}: frame time {ts_ns} ns is before the previous frame ({self._last_ts})"
            )
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
        if track is not None and (previous is None or capture_ts_ns > previous):
            track.pose_ts_ns = capture_ts_ns
        return PoseTag(
            track_id=track_id,
            capture_ts_ns=capture_ts_ns,
            age_ns=at_ns - capture_ts_ns,
            since_previous_ns=None if previous is None else capture_ts_ns - previous,
            tracked=track is not None,
        )
