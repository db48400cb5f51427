"""The retention of a recording folder: every segment under it (this run's and earlier
sessions'), the bytes they hold, and deletion of the oldest closed segments first, so a write
is only made once the folder has room for it under `max_bytes` and the disk keeps
`min_free_bytes` free, and a closed segment older than `max_age_s` is deleted. Space is
reserved before a write and settled after it, so the frame and message writers of one run
never overshoot the cap together."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.messages import now_ns


def disk_free(folder: Path) -> Callable[[], int]:
    """Bytes free to an unprivileged writer on the filesystem of folder (or of its nearest
    existing parent)."""

    def free() -> int:
        path = folder
        while not path.exists() and path != path.parent:
            path = path.parent
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    return free


log = logging.getLogger(__name__)


@dataclass(eq=False)
class Segment:
    """The files of one segment (a frame segment's stream and sidecar, or a message log)."""

    files: tuple[Path, ...]
    bytes: int = 0
    closed: bool = False
    last_write_ns: int = field(default_factory=now_ns)


class Retention:
    """Segments oldest first; thread-safe. max_age_s None keeps segments of any age."""

    def __init__(
        self,
        max_bytes: int,
        max_age_s: float | None,
        clock_ns: Callable[[], int] = now_ns,
        min_free_bytes: int = 0,
        free_bytes: Callable[[], int] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self._free_bytes = free_bytes
        self.max_age_ns = None if max_age_s is None else int(max_age_s * 1e9)
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._segments: list[Segment] = []
        self._reserved = 0
        self.deleted = 0  # segments deleted
        self.delete_errors = 0

    def adopt(self, segments: list[Segment]) -> None:
        """Closed segments already on disk (earlier sessions), oldest first: they count and
        go first."""
        with self._lock:
            self._segments[:0] = segments

    @property
    def used(self) -> int:
        """Bytes the segments hold plus the bytes reserved for writes in progress."""
        with self._lock:
            return self._used()

    def _used(self) -> int:
        return sum(s.bytes for s in self._segments) + self._reserved

    def segments(self) -> int:
        with self._lock:
            return len(self._segments)

    def open(self, files: tuple[Path, ...]) -> Segment:
        """A new segment being written (newest)."""
        segment = Segment(files, last_write_ns=self._clock_ns())
        with self._lock:
            self._segments.append(segment)
        return segment

    def reserve(self, n: int) -> bool:
        """Room for n more bytes, deleting expired and then the oldest closed segments; False
        when even with every closed segment gone n would not fit (nothing is reserved)."""
        with self._lock:
            self._expire()
            while self._used() + n > self.max_bytes or self._disk_short(n):
                oldest = next((s for s in self._segments if s.closed), None)
                if oldest is None:
                    return False
                self._delete(oldest)
            self._reserved += n
            return True

    def _disk_short(self, n: int) -> bool:
        """Writing n bytes would leave the disk with less than min_free_bytes free."""
        if not self.min_free_bytes or self._free_bytes is None:
            return False
        return self._free_bytes() - n < self.min_free_bytes

    def settle(self, segment: Segment | None, reserved: int, written: int) -> None:
        """A write that reserved `reserved` bytes added `written` to `segment` (0 on failure)."""
        with self._lock:
            self._reserved -= reserved
            if segment is not None:
                segment.bytes += written
                segment.last_write_ns = self._clock_ns()

    def measure(self, segment: Segment) -> None:
        """Take a segment's size from disk (after a write that failed part way)."""
        size = _size(segment.files)
        with self._lock:
            segment.bytes = size

    def close(self, segment: Segment) -> None:
        with self._lock:
            segment.closed = True

    def expire(self) -> None:
        """Delete the closed segments older than max_age_s."""
        with self._lock:
            self._expire()

    def _expire(self) -> None:
        if self.max_age_ns is None:
            return
        cutoff = self._clock_ns() - self.max_age_ns
        for segment in [s for s in self._segments if s.closed and s.last_write_ns < cutoff]:
            self._delete(segment)

    def _delete(self, segment: Segment) -> None:
        self._segments.remove(segment)
        self.deleted += 1
        for path in segment.files:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                # Out of the ledger all the same: a file that cannot go is not retried forever.
                self.delete_errors += 1
                log.error("recording retention: cannot delete %s: %s", path, exc)


def existing_segments(root: Path, frame_suffixes: tuple[str, str], message_suffix: str) -> list:
    """The segments already under root (earlier sessions, <session>/frames/<camera>/,
    <session>/clips/<clip>/ and <session>/messages/), oldest last write first, as closed
    Segments."""
    found: list[Segment] = []
    if not root.is_dir():
        return found
    video, index = frame_suffixes
    sidecars = [*root.glob(f"*/frames/*/*{index}"), *root.glob(f"*/clips/*/*{index}")]
    for sidecar in sidecars:
        files = (sidecar.with_suffix(video), sidecar)
        found.append(_closed(files))
    for log_file in root.glob(f"*/messages/*{message_suffix}"):
        found.append(_closed((log_file,)))
    found.sort(key=lambda s: s.last_write_ns)
    return found


def _closed(files: tuple[Path, ...]) -> Segment:
    mtime = 0
    for path in files:
        try:
            mtime = max(mtime, path.stat().st_mtime_ns)
        except OSError:
            continue
    return Segment(files, _size(files), closed=True, last_write_ns=mtime)


def _size(files: tuple[Path, ...]) -> int:
    size = 0
    for path in files:
        try:
            size += path.stat().st_size
        except OSError:
            continue
    return size
