"""A rig's board views from its camera sources, for calibration (`npucam calibrate`).

Every camera is read by a stages.sources.CameraReader (so any camera url works) and the
board is looked for as frames arrive, on the reader's thread. Recorded sources (files, image
folders, the test card) are read to their end as fast as they go and paired by frame number:
capture f is every camera's f-th frame (of those kept, every `every`-th). Live sources (usb,
streams, zmq) are grouped by capture time (stages.rig.sync.FrameGrouper) and one group is
taken every `interval_s`, until `captures` of them show the board or `duration_s` passes.
A capture is the same instant in every camera it has a view of (calibrate.CameraViews).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.messages import Frame
from stages.rig.board import Board, BoardView
from stages.rig.calibrate import MAX_IMAGES, CameraViews
from stages.rig.calibration import CalibrationError
from stages.rig.sync import FrameGrouper
from stages.sources import CameraReader, CameraSpec

log = logging.getLogger(__name__)

LIVE_QUEUE = 64  # frames waiting for the grouper; a full queue drops the newest
POLL_S = 0.05


class _Finder:
    """One camera's board views by frame number, found on its reader thread."""

    def __init__(self, board: Board, name: str, every: int, max_images: int) -> None:
        self.board, self.name, self.every, self.max_images = board, name, every, max_images
        self.size: tuple[int, int] | None = None
        self.views: dict[int, BoardView | None] = {}
        self.error: CalibrationError | None = None
        self.frames = 0
        self.lock = threading.Lock()

    def find(self, image: np.ndarray, seq: int) -> BoardView | None:
        h, w = image.shape[:2]
        with self.lock:
            if self.size is None:
                self.size = (w, h)
            elif (w, h) != self.size:
                raise CalibrationError(
                    f"camera {self.name!r}: frame {seq} is {w}x{h} but its first frame is "
                    f"{self.size[0]}x{self.size[1]}; one camera's images must all have one size"
                )
        try:
            return self.board.detect(image)
        except CalibrationError as exc:
            raise CalibrationError(f"camera {self.name!r} frame {seq}: {exc}") from None

    def recorded(self, stop: threading.Event) -> Callable[[Frame], None]:
        """The emit of a recorded source's reader: every `every`-th frame looked at."""

        def emit(frame: Frame) -> None:
            if self.error is not None or frame.seq % self.every:
                return
            index = frame.seq // self.every
            if index >= self.max_images:
                self.error = CalibrationError(
                    f"camera {self.name!r}: more than {self.max_images} images; use --every"
                )
                stop.set()
                return
            try:
                view = self.find(frame.image, frame.seq)
            except CalibrationError as exc:
                self.error = exc
                stop.set()
                return
            with self.lock:
                self.views[index] = view
                self.frames += 1

        return emit


def _views(finder: _Finder, n: int) -> CameraViews:
    if finder.error is not None:
        raise finder.error
    if finder.size is None:
        raise CalibrationError(f"camera {finder.name!r}: no frames")
    return CameraViews(finder.name, finder.size, tuple(finder.views.get(f) for f in range(n)))


def recorded(
    board: Board,
    specs: Sequence[CameraSpec],
    every: int = 1,
    max_images: int = MAX_IMAGES,
    progress: Callable[[str], None] = log.info,
) -> list[CameraViews]:
    """The board views of recorded cameras, capture f = every camera's f-th kept frame."""
    finders = [_Finder(board, s.name, every, max_images) for s in specs]
    failed = threading.Event()
    readers = [
        CameraReader(_recorded_spec(s), f.recorded(failed))
        for s, f in zip(specs, finders, strict=True)
    ]
    for reader in readers:
        reader.start()
    try:
        while any(r.health != "ended" for r in readers) and not failed.is_set():
            time.sleep(POLL_S)
    finally:
        for reader in readers:
            reader.stop()
    for finder, reader in zip(finders, readers, strict=True):
        if finder.error is not None:
            raise finder.error
        if finder.size is None:
            why = reader.stats()["last_error"] or "the source gave none"
            raise CalibrationError(
                f"camera {finder.name!r}: no frames from {reader.spec.url}: {why}"
            )
    counts = {f.name: len(f.views) for f in finders}
    if len(set(counts.values())) > 1:
        progress(
            "cameras gave different numbers of frames ("
            + ", ".join(f"{n} {c}" for n, c in counts.items())
            + "): captures are paired by frame number, so the f-th frames must be one instant"
        )
    n = max(counts.values())
    return [_views(f, n) for f in finders]


def _recorded_spec(spec: CameraSpec) -> CameraSpec:
    """The camera read once, to its end, as fast as the board search goes."""
    return CameraSpec(
        spec.name, spec.url, base_dir=spec.base_dir, fps=spec.fps, realtime=False, end="stop"
    )


def live(
    board: Board,
    specs: Sequence[CameraSpec],
    fps: float,
    captures: int,
    interval_s: float,
    duration_s: float,
    progress: Callable[[str], None] = log.info,
) -> list[CameraViews]:
    """Board views of live cameras: a group of frames of one instant every interval_s, kept
    when the board is in at least one view, until `captures` are kept or duration_s passes."""
    frames: queue.Queue[Frame] = queue.Queue(LIVE_QUEUE)
    arrived = dict.fromkeys((s.name for s in specs), 0)

    def emit(frame: Frame) -> None:
        arrived[frame.camera] += 1  # one reader thread per camera writes its own entry
        # a full queue: the grouper is behind, and this view is missing from its group
        with contextlib.suppress(queue.Full):
            frames.put_nowait(frame)

    names = [s.name for s in specs]
    grouper = FrameGrouper(dict.fromkeys(names, fps))
    finders = {s.name: _Finder(board, s.name, 1, MAX_IMAGES) for s in specs}
    readers = [CameraReader(s, emit) for s in specs]
    kept: list[dict[str, BoardView | None]] = []
    last_ts: int | None = None
    end = time.monotonic() + duration_s
    for reader in readers:
        reader.start()
    try:
        while len(kept) < captures and time.monotonic() < end:
            try:
                frame = frames.get(timeout=POLL_S)
                groups = grouper.add(frame.camera, frame.seq, frame.capture_ts_ns, frame)
            except queue.Empty:
                groups = grouper.expire()
            for group in groups:
                if last_ts is not None and group.first_ts - last_ts < interval_s * 1e9:
                    continue
                views = {
                    c: finders[c].find(v.item.image, v.item.seq) for c, v in group.views.items()
                }
                seen = sorted(c for c, v in views.items() if v is not None)
                if not seen:
                    continue
                last_ts = group.first_ts
                kept.append(views)
                progress(
                    f"capture {len(kept)}/{captures}: board in {', '.join(seen)}"
                    + (f"; no frame from {', '.join(group.missing)}" if group.missing else "")
                )
                if len(kept) == captures:
                    break
            if all(r.health == "ended" for r in readers):
                break
    finally:
        for reader in readers:
            reader.stop()
    for reader in readers:
        if not arrived[reader.spec.name]:
            why = reader.stats()["last_error"] or "none arrived"
            raise CalibrationError(
                f"camera {reader.spec.name!r}: no frames from {reader.spec.url}: {why}"
            )
    return [CameraViews(n, finders[n].size or (0, 0), tuple(k.get(n) for k in kept)) for n in names]
