"""One stream of a recording (a camera's frames or the published messages) as numbered
segments in one folder: a new segment after `segment_bytes` or `segment_s`, every write within
the folder's retention (retention.py), and a failed write (disk full, read-only folder) a
stored=False answer, logged once per failure, with a new segment tried after `retry_s`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from pipeline.clock import SYSTEM, Clock
from stages.record.retention import Retention, Segment

log = logging.getLogger(__name__)


class Writer(Protocol):
    bytes: int

    def close(self) -> None: ...


W = TypeVar("W", bound=Writer)


def segment_stems(folder: Path, suffix: str) -> list[Path]:
    """The stems (folder/NNNNNN) of the segments of one stream, in order."""
    return sorted(p.with_suffix("") for p in folder.glob(f"[0-9]*{suffix}"))


class SegmentedLog(Generic[W]):
    """Writes one stream's segments; one thread at a time.

    make(stem) opens a segment's writer, whose files are stem with each of `suffixes`.
    """

    def __init__(
        self,
        folder: Path,
        make: Callable[[Path], W],
        suffixes: tuple[str, ...],
        retention: Retention,
        segment_bytes: int,
        segment_s: float,
        retry_s: float,
        clock: Clock = SYSTEM,
    ) -> None:
        self.folder = folder
        self._make = make
        self._suffixes = suffixes
        self._retention = retention
        self._segment_bytes = segment_bytes
        self._segment_s = segment_s
        self._retry_s = retry_s
        self._clock = clock
        self._writer: W | None = None
        self._segment: Segment | None = None
        self._opened_at = 0.0
        self._next = 0
        self._retry_at: float | None = None
        self.failures = 0  # writes that failed on an OSError
        self.over_cap = 0  # writes refused: no room under max_bytes even after deletions
        self.last_error: str | None = None

    def write(self, n: int, append: Callable[[W], object]) -> bool:
        """Store one item of at most n bytes (n counts a new segment's header too) through
        append(writer); False when it was not stored. The segment grows by what the writer's
        `bytes` grew (a new segment's header included)."""
        now = self._clock.monotonic()
        if self._retry_at is not None:
            if now < self._retry_at:
                self.failures += 1
                return False
            self._retry_at = None
        writer = self._writer
        if writer is not None and (
            writer.bytes + n > self._segment_bytes or now - self._opened_at >= self._segment_s
        ):
            self.close()
        if not self._retention.reserve(n):
            if not self.over_cap:
                log.warning(
                    "recording: no room for a write in %s under max_bytes or min_free_bytes "
                    "with every closed segment deleted; such writes are dropped (counted "
                    "`storage`, gauge over_cap)",
                    self.folder,
                )
            self.over_cap += 1
            return False
        written = 0
        try:
            before = 0
            if self._writer is None:
                self._open(now)
            else:
                before = self._writer.bytes
            assert self._writer is not None
            append(self._writer)
            written = self._writer.bytes - before
        except OSError as exc:
            self._failed(exc, now)
            return False
        finally:
            self._retention.settle(self._segment, n, written)
        return True

    def _open(self, now: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._next == 0:  # a folder written before (the same session again) goes on
            stems = segment_stems(self.folder, self._suffixes[0])
            self._next = int(stems[-1].name) + 1 if stems else 1
        stem = self.folder / f"{self._next:06d}"
        self._next += 1
        self._writer = self._make(stem)
        self._segment = self._retention.open(tuple(stem.with_suffix(s) for s in self._suffixes))
        self._opened_at = now

    def _failed(self, exc: OSError, now: float) -> None:
        self.failures += 1
        first = self.last_error is None or self._segment is not None
        self.last_error = f"{self.folder}: {exc.strerror or exc}"
        if first:
            log.error(
                "recording: cannot write %s: %s; items are dropped (counted `storage`) and a "
                "new segment is tried every %g s",
                self.folder,
                exc,
                self._retry_s,
            )
        if self._segment is not None:
            self._retention.measure(self._segment)  # what a short write left on disk
        self.close()
        self._retry_at = now + self._retry_s

    def close(self) -> None:
        """Close the open segment (it stays, readable, until retention deletes it)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as exc:
                log.warning("recording: closing a segment in %s: %s", self.folder, exc)
            self._writer = None
        if self._segment is not None:
            self._retention.close(self._segment)
            self._segment = None
