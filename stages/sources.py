"""The camera reader: one thread per camera turns any registered kind of source
(stages/source_kinds/) into timestamped Frames, and keeps itself alive.

A CameraSpec names the camera and its url; CameraReader reads it on its own thread and hands
each Frame to `emit`. The grab time (the reader's clock, pipeline/clock.py: the host's
pipeline.messages.now_ns unless a test passes a VirtualClock, which also runs the pacing,
stall and backoff waits) is taken as the image leaves the source; seq counts frames per
camera and keeps increasing across loops and reconnects.
Live sources (usb, rtsp/http, zmq) are read as fast as they deliver, so OpenCV's and FFmpeg's
buffers never hold old frames (opencv/opencv#13145: CAP_PROP_BUFFERSIZE is ignored for
RTSP); keeping only the newest is the queue policy of whoever `emit` feeds. Files, image
folders and the test pattern are paced at their frame rate when `realtime`, else read as fast
as `emit` accepts them; paced cameras given one SharedTimeline (capture's `synchronized`)
are paced and stamped by its slots, so frame k of each has one capture time. A live source
that fails to open, ends, or delivers nothing for stall_timeout_s is reopened with capped
exponential backoff and jitter, as DeepStream's nvurisrcbin and Frigate's ffmpeg watchdog
do (docs/reliability.md). A source whose frames change size passes them on as they come
(stats count size_changes).

Health: "starting" until the first frame; "online" while frames come; "stale" once a read
has waited stall_timeout_s (and until the first reopen attempt); "reconnecting" while the
source is reopened or waits for its next try; "ended" when a source whose `end` is "stop"
ends or fails, or after stop().
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.clock import SYSTEM, Clock
from pipeline.messages import Frame
from stages.source_kinds.base import BadFrame, Source, SourceFailed
from stages.source_kinds.spec import CameraSpec, SourceError, redact

__all__ = [
    "CameraReader",
    "CameraSpec",
    "SharedTimeline",
    "Source",
    "SourceError",
    "make_source",
    "redact",
]

log = logging.getLogger(__name__)

HEALTH_STATES = ("starting", "online", "stale", "reconnecting", "ended")
FPS_WINDOW_S = 2.0
# cv2.VideoCapture.read fails once per undecodable frame and keeps failing at the end of the
# source; this many failures in a row are the end.
MAX_FAILED_READS = 5
SKEWS_LOGGED = 5  # frames re-stamped for clock skew, logged per camera; then one per 100
LOGGED_SKIPS = 5  # bad frames / messages logged one by one before one line per 100


@dataclass(frozen=True)
class SharedTimeline:
    """One schedule for several paced cameras (a capture stage's `synchronized` files): frame
    k of a camera at f fps is due at start_s + k/f on the readers' clock and stamped
    start_ns + k/f, whatever camera it is and whenever its file opened, so frame k of
    every camera shares one capture time and a rig groups them exactly. A camera past its
    slot by a period or more skips the frames whose slots have gone (`late_skips`) instead
    of shifting its own schedule; seq is the slot k."""

    start_s: float  # the clock's monotonic seconds at frame 0
    start_ns: int  # the capture time of frame 0 (the clock's now_ns at start_s)

    @classmethod
    def starting_in(cls, clock: Clock, margin_s: float) -> SharedTimeline:
        """Frame 0 due margin_s from now (the time the sources take to open)."""
        return cls(clock.monotonic() + margin_s, clock.now_ns() + round(margin_s * 1e9))


def make_source(spec: CameraSpec, stop: threading.Event) -> Source:
    """The source object of spec, made by its kind (not opened yet); SourceError if it can
    never be read (a sample that is not fetched)."""
    return spec.source_kind.open(spec, stop)


class CameraReader:
    """Reads one camera on its own thread and calls emit(frame) for every frame.

    emit may block (the back-pressure of a `block` queue); it must return promptly once the
    engine stops. It returns False for a frame the engine did not take (it is stopping):
    counted as `refused`, so `frames` = frames taken + `refused`. health is one of
    HEALTH_STATES; stats() is a snapshot for metrics.
    """

    def __init__(
        self,
        spec: CameraSpec,
        emit: Callable[[Frame], bool | None],
        clock: Clock = SYSTEM,
        timeline: SharedTimeline | None = None,
    ) -> None:
        self.spec = spec
        self.emit = emit
        self._clock = clock
        self._timeline = timeline
        self._stop = threading.Event()
        self._source = make_source(spec, self._stop)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._state = "starting"
        self._reading_since: float | None = None
        self._grabs: collections.deque[float] = collections.deque()
        self._counts = {
            "frames": 0,
            "reconnects": 0,
            "bad_frames": 0,
            "bad_messages": 0,
            "size_changes": 0,
            "emit_errors": 0,
            "clock_skews": 0,
            "refused": 0,
            "late_skips": 0,
        }
        self._last_grab_ns: int | None = None
        self._frame_size: tuple[int, int] | None = None
        self._last_error: str | None = None
        self._seq = 0
        # A paced source's next read (monotonic s), kept across a looping file's reopen so
        # the first frame of the next pass takes the slot after the last one.
        self._due = 0.0
        # On a shared timeline: the slot of the next frame read, and how many frames to read
        # and drop because their slots went by while this camera was late.
        self._slot = 0
        self._skip = 0
        self.opened = False  # the source opened at least once

    def start(self) -> None:
        """Start the reader thread (once)."""
        if self._thread is not None:
            raise SourceError(f"camera {self.spec.name!r}: reader already started")
        self._thread = threading.Thread(
            target=self._run, name=f"capture-{self.spec.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Ask the thread to stop and join it for up to timeout s; True once it has ended.

        A live stream blocked inside FFmpeg returns by its read timeout (stall_timeout_s) at
        the latest; the thread is a daemon, so it never holds up the process.
        """
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "camera %s: reader still inside a blocking read after %.1f s",
                self.spec.name,
                timeout,
            )
            return False
        return True

    @property
    def health(self) -> str:
        state = self._state
        since = self._reading_since
        if (
            state == "online"
            and since is not None
            and self._clock.monotonic() - since > self.spec.stall_timeout_s
        ):
            return "stale"
        return state

    def stats(self) -> dict:
        """frames, reconnects, bad_frames, bad_messages, size_changes, emit_errors, refused,
        clock_skews (frames re-stamped on arrival, see CameraSpec.max_clock_skew_ms), fps,
        last_grab_ns (and as a string), frame_size [H, W], health, last_error, source."""
        now = self._clock.monotonic()
        with self._lock:
            grabs = [t for t in self._grabs if now - t <= FPS_WINDOW_S]
        fps = 0.0
        if len(grabs) >= 2 and grabs[-1] > grabs[0]:
            fps = (len(grabs) - 1) / (grabs[-1] - grabs[0])
        return {
            **self._counts,
            "fps": round(fps, 2),
            "last_grab_ns": self._last_grab_ns,
            # exact for readers whose JSON numbers are doubles (docs/protocol.md)
            "last_grab_ns_str": None if self._last_grab_ns is None else str(self._last_grab_ns),
            "frame_size": list(self._frame_size) if self._frame_size else None,
            "health": self.health,
            "last_error": self._last_error,
            "source": self._source.description,
        }

    def _fail(self, message: str) -> None:
        self._last_error = message
        log.warning("camera %s: %s", self.spec.name, message)

    def _lost(self, message: str) -> None:
        """The source broke while reading: health says so before the slow close."""
        self._fail(message)
        self._state = "reconnecting" if self.spec.reconnects else "ended"

    def _run(self) -> None:
        attempt = 0
        retry = False
        try:
            while not self._stop.is_set():
                if retry:
                    self._counts["reconnects"] += 1
                    self._state = "reconnecting"
                retry = True
                outcome = "failed"
                try:
                    self._source.open()
                    self.opened = True
                except SourceFailed as exc:
                    self._fail(str(exc))
                except Exception as exc:
                    log.exception("camera %s: opening failed", self.spec.name)
                    self._fail(f"cannot open {self._source.description}: {exc!r}")
                else:
                    try:
                        flowed, outcome = self._pump()
                    finally:
                        self._source.close()
                    if self._stop.is_set():
                        break
                    if flowed:
                        attempt = 0
                        if outcome == "ended" and self.spec.loop and not self.spec.live:
                            retry = False
                            continue
                if not self.spec.reconnects:
                    break
                # A stalled camera shows "stale" until the first reopen attempt begins.
                self._state = "stale" if outcome == "stalled" else "reconnecting"
                if self._clock.wait(self._stop, self._backoff(attempt)):
                    break
                attempt += 1
        except Exception as exc:
            # A bug in one camera's reader ends that camera only, never the process.
            log.exception("camera %s: reader failed", self.spec.name)
            self._last_error = f"reader failed: {exc!r}"
        finally:
            self._source.close()
            self._state = "ended"

    def _backoff(self, attempt: int) -> float:
        delay = min(self.spec.reconnect_max_s, self.spec.reconnect_min_s * 2.0 ** min(attempt, 30))
        return max(self.spec.reconnect_min_s, delay * random.uniform(0.5, 1.0))

    def _pump(self) -> tuple[bool, str]:
        """Read until the source ends, fails or stop: (a frame was read, outcome), outcome
        one of "stop", "ended" (end of file or folder, or a stream closed), "stalled" (a live
        read that waited stall_timeout_s) or "failed"."""
        spec = self.spec
        rate = spec.fps or self._source.native_fps
        paced = spec.realtime and not spec.live and rate is not None
        period = 1.0 / rate if paced and rate is not None else 0.0
        timeline = self._timeline if paced and not self._source.own_timeline else None
        self._due = max(self._clock.monotonic(), self._due)
        flowed = False
        failed_reads = 0
        while not self._stop.is_set():
            # A read that delivers nothing (the end of a file, before the next pass) leaves
            # its slot to the next read: a looping file does not pause at its end.
            if not failed_reads and self._wait_turn(paced, timeline, period):
                break
            started = self._reading_since = self._clock.monotonic()
            try:
                item = self._source.read(self._seq)
            except BadFrame as exc:
                self._bad_frame(exc, timeline is not None)
                continue
            except Exception as exc:
                # An unexpected backend error is a failure of this source, handled by policy.
                log.exception("camera %s: read failed", self.spec.name)
                self._lost(f"read from {self._source.description} failed: {exc!r}")
                return flowed, "failed"
            finally:
                self._reading_since = None
            if item is None:
                if self._stop.is_set():
                    break
                waited = self._clock.monotonic() - started
                if spec.live and waited >= 0.9 * spec.stall_timeout_s:
                    if failed_reads:  # frames FFmpeg could not decode, then the stall
                        self._skipped(
                            "bad_frames", "undecodable frame before a stall", failed_reads
                        )
                    self._state = "stale"
                    self._fail(f"{self._source.description}: no frame for {waited:.1f} s (stalled)")
                    return flowed, "stalled"
                if paced and not failed_reads:
                    self._due -= period  # the slot this read waited for: unused
                failed_reads += 1
                if failed_reads < MAX_FAILED_READS:
                    continue
                if spec.live:
                    self._lost(f"{self._source.description}: stream ended")
                return flowed, "ended"
            # Reads that failed between two good frames were frames FFmpeg could not decode.
            self._counts["bad_frames"] += failed_reads
            failed_reads = 0
            grab_ns = self._clock.now_ns()
            image, capture_ns, description, *own_seq = item
            stamp = self._stamp(grab_ns, capture_ns, own_seq, timeline, period)
            if stamp is None:
                continue
            capture_ns, seq = stamp
            self._note_grab(image, grab_ns)
            frame = Frame(
                camera=spec.name,
                seq=seq,
                capture_ts_ns=capture_ns,
                deadline_ns=capture_ns + int(spec.staleness_ms * 1_000_000),
                image=image,
                source=description,
            )
            self._seq = seq + 1
            flowed = True
            self._state = "online"
            try:
                if self.emit(frame) is False:
                    self._counts["refused"] += 1
            except Exception as exc:
                # The engine's bug is counted and reported; the camera keeps reading.
                self._counts["emit_errors"] += 1
                self._last_error = f"emit failed: {exc!r}"
                log.exception("camera %s: emit failed", spec.name)
        return flowed, "stop"

    def _wait_turn(self, paced: bool, timeline: SharedTimeline | None, period: float) -> bool:
        """Wait until the next read is due (True: stop was asked). On a shared timeline that
        is the next frame's slot, and a camera a period or more past it reads and drops the
        frames whose slots have gone by (`late_skips`, no waits meanwhile), so its next
        emitted frame is the one due now. Else a paced camera keeps its own schedule, which
        a late read shifts by its lateness."""
        if timeline is not None:
            if self._skip:
                return False
            delay = timeline.start_s + self._slot * period - self._clock.monotonic()
            if delay > 0:
                return self._clock.wait(self._stop, delay)
            self._skip = int(-delay // period)
            return False
        if not paced:
            return False
        delay = self._due - self._clock.monotonic()
        if delay > 0 and self._clock.wait(self._stop, delay):
            return True
        self._due = max(self._due + period, self._clock.monotonic() - period)
        return False

    def _bad_frame(self, exc: BadFrame, on_timeline: bool) -> None:
        """A frame the source could not use: counted; on a shared timeline it takes its
        slot, as the file's frame it is."""
        self._skipped(exc.key, str(exc))
        if on_timeline:
            self._take_slot(count_skip=False)

    def _stamp(
        self,
        grab_ns: int,
        capture_ns: int | None,
        own_seq: list[int],
        timeline: SharedTimeline | None,
        period: float,
    ) -> tuple[int, int] | None:
        """A frame's (capture time, seq): its slot's on a shared timeline (None: a frame to
        drop), else the source's own (checked by _trusted) or the grab time, and the
        source's seq or the reader's count."""
        if timeline is not None:
            slot = self._take_slot()
            if slot is None:
                return None
            return timeline.start_ns + round(slot * period * 1e9), slot
        capture_ns = grab_ns if capture_ns is None else self._trusted(capture_ns, grab_ns)
        return capture_ns, own_seq[0] if own_seq else self._seq

    def _take_slot(self, count_skip: bool = True) -> int | None:
        """The slot of the frame just read, or None when it is one to drop (counted in
        `late_skips` unless count_skip is False: an undecodable frame, counted as such)."""
        slot = self._slot
        self._slot += 1
        if not self._skip:
            return slot
        self._skip -= 1
        self._counts["late_skips"] += count_skip
        return None

    def _trusted(self, capture_ns: int, grab_ns: int) -> int:
        """A capture time the source sent (zmq: the sender's clock), or the arrival time
        when it is further than max_clock_skew_ms from it: one frame stamped a day ahead
        must not hold the camera's deadlines and tracks a day ahead (counted, logged). A
        source with a timeline of its own (a recording) is taken as it is."""
        skew_ns = capture_ns - grab_ns
        if self._source.own_timeline or abs(skew_ns) <= self.spec.max_clock_skew_ms * 1_000_000:
            return capture_ns
        self._counts["clock_skews"] += 1
        n = self._counts["clock_skews"]
        self._last_error = (
            f"frame stamped {skew_ns / 1e9:+.3f} s from this host's clock (over "
            f"max_clock_skew_ms {self.spec.max_clock_skew_ms:g}): re-stamped on arrival"
        )
        if n <= SKEWS_LOGGED or n % 100 == 0:
            log.warning("camera %s: %s (%d so far)", self.spec.name, self._last_error, n)
        return grab_ns

    def _skipped(self, key: str, message: str, n: int = 1) -> None:
        """Count n items that could not be used under key (bad_frames, bad_messages) and log
        them: each of the first LOGGED_SKIPS, then one line per 100."""
        before = self._counts[key]
        self._counts[key] += n
        self._last_error = message
        if before < LOGGED_SKIPS or before // 100 != self._counts[key] // 100:
            log.warning(
                "camera %s: skipped %s (%d so far): %s",
                self.spec.name,
                key.replace("_", " ")[:-1],
                self._counts[key],
                message,
            )

    def _note_grab(self, image: np.ndarray, grab_ns: int) -> None:
        now = self._clock.monotonic()
        self._last_grab_ns = grab_ns
        self._counts["frames"] += 1
        size = image.shape[:2]
        if self._frame_size is not None and size != self._frame_size:
            self._counts["size_changes"] += 1
            log.info("camera %s: frame size %s -> %s", self.spec.name, self._frame_size, size)
        self._frame_size = size
        with self._lock:
            self._grabs.append(now)
            while self._grabs and now - self._grabs[0] > FPS_WINDOW_S:
                self._grabs.popleft()
