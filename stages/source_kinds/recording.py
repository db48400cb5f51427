"""recording:SESSION[?camera=NAME&times=shifted|recorded]: a camera of a recording (a record
stage's session folder, docs/recording.md) as a source: its frames in recorded order with their
recorded seq, paced by their capture times. The cameras of one session opened in one process
share a timeline, so they stay synchronised by capture time: with `realtime`, frame k is due
at the shared start + (capture_k - the session's first capture); without, as fast as the
pipeline takes them, but a camera only delivers a frame once every other open camera of the
session has delivered all frames captured before it.

times=shifted (the default) gives each frame its recorded capture time moved by one offset
shared by the session's cameras (the first capture becomes the start): deadlines and staleness
work as live, and capture times across cameras keep their recorded differences exactly.
times=recorded gives the recorded capture times unchanged (frames are then past their
deadline: run with `drop_stale = false` inboxes)."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

from pipeline.clock import SYSTEM, Clock
from stages.record.frame_log import (
    FRAMES_DIR,
    INDEX_SUFFIX,
    FrameEntry,
    RecordingError,
    read_frames,
    read_index,
)
from stages.record.segments import segment_stems
from stages.source_kinds.base import BadFrame, Source, SourceFailed
from stages.source_kinds.registry import SourceKind

if TYPE_CHECKING:
    from stages.source_kinds.spec import CameraSpec

TIMES = ("shifted", "recorded")


class RecordingKind(SourceKind):
    """target: {"session": PATH as given, "camera": NAME or None (the camera's own name),
    "times": shifted | recorded}. Probed by reading its first frames."""

    name = "recording"
    schemes = ("recording",)
    forms = ("recording:",)

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> dict:
        session, _, query = rest.partition("?")
        if not session:
            raise spec.error("recording needs a session folder: recording:SESSION")
        target: dict = {"session": session, "camera": None, "times": "shifted"}
        try:
            pairs = urllib.parse.parse_qsl(query, strict_parsing=bool(query))
        except ValueError as exc:
            raise spec.error(f"recording query: {exc}") from None
        for key, value in pairs:
            if key not in ("camera", "times"):
                raise spec.error(f"recording query: unknown key {key!r} (camera, times)")
            if key == "times" and value not in TIMES:
                raise spec.error(f"recording query times: {value!r} is not one of {TIMES}")
            target[key] = value
        return target

    def path(self, spec: CameraSpec) -> Path:
        return spec.base_dir / Path(spec.target["session"]).expanduser()

    def folder(self, spec: CameraSpec) -> Path:
        return self.path(spec) / FRAMES_DIR / (spec.target["camera"] or spec.name)

    def missing(self, spec: CameraSpec) -> str | None:
        folder = self.folder(spec)
        if not segment_stems(folder, INDEX_SUFFIX):
            return f"{folder}: no recorded frames of camera {folder.name!r}"
        return None

    def open(self, spec: CameraSpec, stop: threading.Event) -> RecordingSource:
        return RecordingSource(
            self.path(spec),
            spec.target["camera"] or spec.name,
            realtime=spec.realtime,
            shifted=spec.target["times"] == "shifted",
            stop=stop,
        )


class Timeline:
    """The shared clock of one session's cameras in one process: the start, the session's
    first capture time, and (not realtime) each open camera's next capture time."""

    def __init__(self, first_capture_ns: int, clock: Clock) -> None:
        self.first_capture_ns = first_capture_ns
        self.start = clock.monotonic()
        self.start_ns = clock.now_ns()
        self.users = 0
        self._next: dict[str, int] = {}
        self._turn = threading.Condition()

    def enter(self, camera: str) -> None:
        """A camera opened: the others wait for it until it says when its first frame is."""
        with self._turn:
            self._next[camera] = 0

    def wait_turn(self, camera: str, capture_ns: int, stop: threading.Event) -> bool:
        """Block until no other open camera has a frame captured before capture_ns left to
        deliver; False when stop was set."""
        with self._turn:
            self._next[camera] = capture_ns
            self._turn.notify_all()
            while not stop.is_set():
                if capture_ns <= min(self._next.values()):
                    return True
                self._turn.wait(0.1)  # in steps, to notice stop
            return False

    def leave(self, camera: str) -> None:
        with self._turn:
            self._next.pop(camera, None)
            self._turn.notify_all()


_timelines: dict[Path, Timeline] = {}
_timelines_lock = threading.Lock()


def _join(session: Path, clock: Clock) -> Timeline:
    """The session's timeline in this process, made by the first of its cameras to open."""
    with _timelines_lock:
        timeline = _timelines.get(session)
        if timeline is None:
            timeline = _timelines[session] = Timeline(first_capture(session), clock)
        timeline.users += 1
        return timeline


def _leave(session: Path, timeline: Timeline, camera: str) -> None:
    timeline.leave(camera)
    with _timelines_lock:
        timeline.users -= 1
        if timeline.users == 0 and _timelines.get(session) is timeline:
            del _timelines[session]


def first_capture(session: Path) -> int:
    """The earliest recorded capture time of any camera of the session, ns."""
    firsts = []
    for folder in sorted((session / FRAMES_DIR).glob("*")):
        for stem in segment_stems(folder, INDEX_SUFFIX):
            entries = read_index(stem.with_suffix(INDEX_SUFFIX))
            if entries:
                firsts.append(entries[0].capture_ts_ns)
                break
    if not firsts:
        raise SourceFailed(f"{session}: no recorded frames")
    return min(firsts)


class RecordingSource(Source):
    """One camera of a session, read segment by segment."""

    def __init__(
        self,
        session: Path,
        camera: str,
        realtime: bool,
        shifted: bool,
        stop: threading.Event,
        clock: Clock = SYSTEM,
    ) -> None:
        self.session = session.resolve() if session.exists() else session
        self.camera = camera
        self.realtime = realtime
        self.shifted = shifted
        self.own_timeline = True  # capture times come from the recording, not this host
        self.description = f"recording:{session}#{camera}"
        self._stop = stop
        self._clock = clock
        self._frames: Iterator[tuple[FrameEntry, bytes]] | None = None
        self._timeline: Timeline | None = None

    def open(self) -> None:
        folder = self.session / FRAMES_DIR / self.camera
        stems = segment_stems(folder, INDEX_SUFFIX)
        if not stems:
            raise SourceFailed(f"{folder}: no recorded frames of camera {self.camera!r}")
        try:
            self._timeline = _join(self.session, self._clock)
        except RecordingError as exc:
            raise SourceFailed(str(exc)) from None
        if not self.realtime:
            self._timeline.enter(self.camera)
        self._frames = (
            item for stem in stems for item in read_frames(stem.with_suffix(INDEX_SUFFIX))
        )

    def read(self, seq: int) -> tuple[np.ndarray, int, str, int] | None:
        assert self._frames is not None and self._timeline is not None
        try:
            entry, jpeg = next(self._frames)
        except StopIteration:
            self._timeline.leave(self.camera)
            return None
        except RecordingError as exc:
            raise BadFrame("bad_frames", str(exc)) from None
        timeline = self._timeline
        offset = entry.capture_ts_ns - timeline.first_capture_ns
        if self.realtime:
            delay = timeline.start + offset / 1e9 - self._clock.monotonic()
            if delay > 0 and self._clock.wait(self._stop, delay):
                return None
        elif not timeline.wait_turn(self.camera, entry.capture_ts_ns, self._stop):
            return None
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise BadFrame("bad_frames", f"{self.description}: seq {entry.seq}: JPEG not decodable")
        capture = timeline.start_ns + offset if self.shifted else entry.capture_ts_ns
        return image, capture, self.description, entry.seq

    def close(self) -> None:
        if self._timeline is not None:
            _leave(self.session, self._timeline, self.camera)
            self._timeline = None
        self._frames = None


KIND = RecordingKind()
