"""Camera sources: one reader thread per camera turns a file, device, stream, image folder,
ZeroMQ feed or test pattern into timestamped Frames, and keeps itself alive.

A CameraSpec names the camera and its url; CameraReader reads it on its own thread and hands
each Frame to `emit`. The grab time (the reader's clock, pipeline/clock.py: the host's
pipeline.messages.now_ns unless a test passes a VirtualClock, which also runs the pacing,
stall and backoff waits) is taken as the image leaves the source; seq counts frames per
camera and keeps increasing across loops and reconnects.
Live sources (usb, rtsp/http, zmq) are read as fast as they deliver, so OpenCV's and FFmpeg's
buffers never hold old frames (opencv/opencv#13145: CAP_PROP_BUFFERSIZE is ignored for
RTSP); keeping only the newest is the queue policy of whoever `emit` feeds. Files, image
folders and the test pattern are paced at their frame rate when `realtime`, else read as fast
as `emit` accepts them. A live source that fails to open, ends, or delivers nothing for
stall_timeout_s is reopened with capped exponential backoff and jitter, as DeepStream's
nvurisrcbin and Frigate's ffmpeg watchdog do (docs/reliability.md).

url forms:
    PATH, file:PATH          video file (relative to base_dir)
    sample:NAME              pipeline.assets.asset_path(NAME), e.g. sample:bikes.mp4
    usb:N                    USB/V4L2 device index N
    rtsp://, rtsps://, http://, https://
                             anything FFmpeg opens through cv2.VideoCapture (incl. HTTP MJPEG)
    images:DIR               the image files of DIR in sorted order, paced by `fps`
    zmq:tcp://HOST:PORT      PULL frames a remote capture process PUSHes (stages.frame_wire);
                             connects, does not bind; every frame it gets belongs to this camera
                             and keeps the sender's seq and grab time (a grab time further than
                             max_clock_skew_ms from this host's clock is replaced by the
                             arrival time and counted in clock_skews); CURVE with the keys of
                             CameraSpec.curve (docs/security.md)
    synthetic:[?width=W&height=H&fps=F]
                             a deterministic moving test card with the seq drawn in it

Health: "starting" until the first frame; "online" while frames come; "stale" once a read
has waited stall_timeout_s (and until the first reopen attempt); "reconnecting" while the
source is reopened or waits for its next try; "ended" when a source whose `end` is "stop"
ends or fails, or after stop(). Notes from OpenCV 4.14's FFmpeg backend, checked by the
tests: a read that times out leaves the capture dead, so a stream's read timeout is
stall_timeout_s itself; a read fails once per undecodable frame and the stream goes on; every
frame of a stream is scaled to the size it had when opened, so a size change shows only after
a reopen (folders and zmq pass sizes through; stats count size_changes). RTSP over TCP is
chosen with OpenCV's own variable OPENCV_FFMPEG_CAPTURE_OPTIONS="rtsp_transport;tcp". ZeroMQ
reconnects its TCP link itself, but not after a protocol error (a message over MAXMSGSIZE, or
one that fails CURVE's authentication, ends that connection for good in libzmq 4.3.5), so a
zmq source silent for stall_timeout_s is reopened like any live source.
"""

from __future__ import annotations

import collections
import logging
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import zmq

from pipeline import assets
from pipeline.clock import SYSTEM, Clock
from pipeline.config import DEFAULT_MAX_PIXELS, DEFAULT_RECEIVE_BUFFER_BYTES
from pipeline.errors import NpucamError
from pipeline.messages import Frame
from pipeline.security import Curve, SocketSecurity
from stages.frame_wire import FrameWireError, decode_frame

log = logging.getLogger(__name__)

HEALTH_STATES = ("starting", "online", "stale", "reconnecting", "ended")
LIVE_KINDS = ("usb", "stream", "zmq")
STREAM_SCHEMES = ("rtsp", "rtsps", "http", "https")
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".pgm", ".ppm", ".tif", ".tiff", ".webp")
SYNTHETIC_DEFAULTS = {"width": 320, "height": 240, "fps": 25.0}
FPS_WINDOW_S = 2.0
# cv2.VideoCapture.read fails once per undecodable frame and keeps failing at the end of the
# source; this many failures in a row are the end.
MAX_FAILED_READS = 5
MAX_WIRE_SEQ = 2**53  # a received seq must stay exact for JSON readers whose numbers are doubles
SKEWS_LOGGED = 5  # frames re-stamped for clock skew, logged per camera; then one per 100
LOGGED_SKIPS = 5  # bad frames / messages logged one by one before one line per 100


class SourceError(NpucamError):
    """A camera spec that cannot describe a source; the message names the camera and url."""


@dataclass
class CameraSpec:
    """One camera as the config gives it. Times are in seconds unless the name says ms.

    loop: restart a file or image folder at its end (seq continues).
    realtime: pace files, folders and the test card at their frame rate (`fps` overrides the
        file's own; a folder without `fps` is not paced); when False they are read as fast
        as emit accepts. Live sources are never paced and ignore `fps`.
    staleness_ms: deadline budget added to each frame's capture time.
    stall_timeout_s: a live source without a frame this long is "stale" and is reopened.
    end: what a failure or the end of the source does: "stop" (health "ended") or
        "reconnect" (reopen with backoff); None = "stop" for files, folders and the test
        card, "reconnect" for live sources.
    curve: zmq sources: the CURVE keys to connect with (pipeline.security); None is plain.
    max_clock_skew_ms: zmq sources: a received grab time further than this from the arrival
        time is the sender's clock, not the hop: the frame is re-stamped on arrival.
    max_pixels: zmq sources: a frame of more pixels is refused (counted bad_messages) from its
        header, before its JPEG is decoded; the socket drops a peer whose message could not
        be such a frame (MAXMSGSIZE).
    receive_buffer_bytes: zmq sources: SO_RCVBUF of the TCP stream (the kernel doubles it).
        What it holds waits for this reader, so it is also the lag a reader that falls behind
        sees: 1 MiB (the default) suits JPEG frames; raw frames need room for a few frames to
        keep the link busy (docs/benchmarks.md, frame_transport: 8 MiB for 720p and 1080p).
    """

    name: str
    url: str
    base_dir: Path = field(default_factory=Path.cwd)
    loop: bool = False
    realtime: bool = True
    fps: float | None = None
    staleness_ms: float = 500
    stall_timeout_s: float = 5.0
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    end: str | None = None
    curve: Curve | None = None
    max_clock_skew_ms: float = 10_000.0
    max_pixels: int = DEFAULT_MAX_PIXELS
    receive_buffer_bytes: int = DEFAULT_RECEIVE_BUFFER_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SourceError(f"camera {self.name!r}: name must be a non-empty string")
        if not isinstance(self.url, str) or not self.url.strip():
            raise SourceError(f"camera {self.name!r}: url must be a non-empty string")
        self.base_dir = Path(self.base_dir)
        positive = (
            "staleness_ms",
            "stall_timeout_s",
            "reconnect_min_s",
            "reconnect_max_s",
            "max_clock_skew_ms",
        )
        for key in positive:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise self._error(f"{key} must be a positive number, got {value!r}")
        if self.fps is not None and (
            isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)) or not self.fps > 0
        ):
            raise self._error(f"fps must be a positive number, got {self.fps!r}")
        if self.reconnect_min_s > self.reconnect_max_s:
            raise self._error(
                f"reconnect_min_s ({self.reconnect_min_s}) exceeds reconnect_max_s "
                f"({self.reconnect_max_s})"
            )
        if self.end not in (None, "stop", "reconnect"):
            raise self._error(f"end must be 'stop' or 'reconnect', got {self.end!r}")
        if type(self.max_pixels) is not int or self.max_pixels < 1:
            raise self._error(f"max_pixels must be a positive integer, got {self.max_pixels!r}")
        if type(self.receive_buffer_bytes) is not int or self.receive_buffer_bytes < 1:
            got = self.receive_buffer_bytes
            raise self._error(f"receive_buffer_bytes must be a positive integer, got {got!r}")
        self._parsed = _parse_url(self)

    @property
    def kind(self) -> str:
        """file, usb, stream, images, zmq or synthetic."""
        return self._parsed[0]

    @property
    def sample(self) -> str | None:
        """The asset name of a sample:NAME source (pipeline.assets), None for other urls."""
        kind, target = self._parsed
        return target[1] if kind == "file" and target[0] == "sample" else None

    @property
    def live(self) -> bool:
        """True for sources that deliver at their own pace (usb, stream, zmq)."""
        return self.kind in LIVE_KINDS

    @property
    def path(self) -> Path | None:
        """The file or folder a file, sample or images source reads (it may not exist yet);
        None for other kinds."""
        kind, target = self._parsed
        if kind == "images":
            return self.base_dir / Path(target).expanduser()
        if kind != "file":
            return None
        how, value = target
        if how == "sample":
            return assets.cache_dir() / value
        return self.base_dir / Path(value).expanduser()

    @property
    def reconnects(self) -> bool:
        """Whether a failure or end of this source reopens it (the `end` policy)."""
        if self.end is None:
            return self.live
        return self.end == "reconnect"

    def _error(self, what: str) -> SourceError:
        return SourceError(f"camera {self.name!r} ({redact(self.url)}): {what}")


def redact(url: str) -> str:
    """url with any password replaced by ***, for logs and frame descriptions."""
    return re.sub(r"(://[^/:@]*:)[^/]*@", r"\1***@", url, count=1)


def _parse_url(spec: CameraSpec) -> tuple[str, object]:  # noqa: C901
    """(kind, target) of spec.url; SourceError names the camera and url when it is invalid."""
    url = spec.url.strip()
    scheme, sep, rest = url.partition(":")
    scheme = scheme.lower() if sep else ""
    if scheme in STREAM_SCHEMES:
        try:
            host = urllib.parse.urlsplit(url).hostname
        except ValueError:
            host = None
        if not rest.startswith("//") or not host:
            raise spec._error(f"a {scheme} url needs a host: {scheme}://HOST[:PORT]/PATH")
        return "stream", url
    if scheme == "usb":
        if not re.fullmatch(r"\d+", rest):
            raise spec._error("usb needs a device index: usb:N with N >= 0")
        return "usb", int(rest)
    if scheme == "zmq":
        m = re.fullmatch(r"tcp://([^\s:/*]+|\[[0-9a-fA-F:.]+\]):(\d{1,5})", rest)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise spec._error("zmq needs a ZeroMQ tcp endpoint: zmq:tcp://HOST:PORT")
        return "zmq", rest
    if scheme == "synthetic":
        return "synthetic", _parse_synthetic(spec, rest)
    if scheme == "images":
        if not rest:
            raise spec._error("images needs a folder: images:DIR")
        return "images", rest
    if scheme == "sample":
        if not rest or "/" in rest or "\\" in rest:
            raise spec._error("sample needs an asset name: sample:NAME (e.g. sample:bikes.mp4)")
        return "file", ("sample", rest)
    if scheme == "file":
        if not rest:
            raise spec._error("file needs a path: file:PATH")
        return "file", ("path", rest)
    if "://" in url or (sep and re.fullmatch(r"[a-z][a-z0-9+.-]+", scheme)):
        raise spec._error(
            f"unknown source scheme {scheme!r}; expected a file path, file:, sample:, usb:, "
            "rtsp://, rtsps://, http://, https://, images:, zmq:tcp:// or synthetic:"
        )
    return "file", ("path", url)


def _parse_synthetic(spec: CameraSpec, rest: str) -> dict:
    query = rest[1:] if rest.startswith("?") else rest
    if rest and not rest.startswith("?"):
        raise spec._error("synthetic takes only a query: synthetic:?width=W&height=H&fps=F")
    params = dict(SYNTHETIC_DEFAULTS)
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise spec._error(f"synthetic query: {exc}") from None
    for key, value in pairs:
        if key not in params:
            raise spec._error(f"synthetic query: unknown key {key!r} (width, height, fps)")
        try:
            number = float(value) if key == "fps" else int(value)
        except ValueError:
            raise spec._error(f"synthetic query {key}: expected a number, got {value!r}") from None
        limit = 1000.0 if key == "fps" else 8192
        if not 0 < number <= limit:
            raise spec._error(f"synthetic query {key}: must be in (0, {limit}], got {value}")
        params[key] = number
    return params


class _SourceFailed(Exception):
    """The source cannot be opened now."""


class _BadFrame(Exception):
    """One item could not be turned into an image; it is skipped and counted under `key`."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class _Source:
    """How a reader talks to one kind of source; only the reader thread calls these."""

    description = ""
    native_fps: float | None = None

    def open(self) -> None:
        """Raise _SourceFailed if the source cannot be opened now."""
        raise NotImplementedError

    def read(self, seq: int) -> tuple | None:
        """(image BGR uint8 [H, W, 3], capture_ts_ns or None = now, description) of the next
        item (seq is the number it will get), or with a 4th element the seq it carries
        itself (zmq: the sender's); None when no image came: the end, a frame OpenCV could
        not decode, a timed-out read or stop; _BadFrame to skip one item."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the source; idempotent."""


def _as_bgr(image: np.ndarray | None) -> np.ndarray:
    """image as uint8 [H, W, 3], or _BadFrame when it is not an 8-bit image."""
    if image is None or image.size == 0 or image.dtype != np.uint8:
        raise _BadFrame("bad_frames", "empty or non-8-bit frame")
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    if image.ndim == 3 and image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2BGR)
    if image.ndim != 3 or image.shape[2] != 3:
        raise _BadFrame("bad_frames", f"frame of shape {image.shape} is not an image")
    return image


class _CaptureSource(_Source):
    """A cv2.VideoCapture: a video file, a USB device or a URL FFmpeg opens."""

    def __init__(self, target: str | int, description: str, params: list[int] | None = None):
        self.target = target
        self.description = description
        self.params = params
        self.cap: cv2.VideoCapture | None = None

    def open(self) -> None:
        if isinstance(self.target, int):
            cap = cv2.VideoCapture(self.target)
        elif self.params:
            cap = cv2.VideoCapture(self.target, cv2.CAP_FFMPEG, self.params)
        else:
            cap = cv2.VideoCapture(self.target, cv2.CAP_FFMPEG)
        if not cap.isOpened():
            cap.release()
            raise _SourceFailed(f"cannot open {self.description}")
        self.cap = cap
        fps = cap.get(cv2.CAP_PROP_FPS)
        self.native_fps = fps if 0 < fps < 1000 else None

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        ok, image = self.cap.read()
        if not ok:
            return None
        return _as_bgr(image), None, self.description

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None


class _FileSource(_CaptureSource):
    """A video file. A read that fails before the file's frame count (CAP_PROP_FRAME_COUNT,
    the container's) is reached is a frame that could not be decoded: skipped and counted
    (bad_frames); OpenCV reads on past it, as it does past damaged data. Without a frame
    count, failures in a row are the end (MAX_FAILED_READS)."""

    def __init__(self, path: Path):
        super().__init__(str(path), f"file:{path}")
        self.path = path
        self.frame_count = 0
        self.frames_read = 0  # this pass: decoded plus failed, against frame_count

    def open(self) -> None:
        if not self.path.is_file():
            raise _SourceFailed(f"{self.path}: no such file")
        try:
            super().open()
        except _SourceFailed:
            raise _SourceFailed(
                f"cannot open {self.description}: not a video OpenCV can read"
            ) from None
        count = self.cap.get(cv2.CAP_PROP_FRAME_COUNT)
        self.frame_count = int(count) if 0 < count < 1e9 else 0
        self.frames_read = 0

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        ok, image = self.cap.read()
        self.frames_read += 1
        if ok:
            return _as_bgr(image), None, self.description
        if self.frames_read <= self.frame_count:
            raise _BadFrame(
                "bad_frames",
                f"{self.description}: frame {self.frames_read} of {self.frame_count} could not "
                "be decoded",
            )
        return None


class _ImageFolderSource(_Source):
    def __init__(self, folder: Path):
        self.folder = folder
        self.description = f"images:{folder}"
        self.files: list[Path] = []
        self.index = 0

    def open(self) -> None:
        if not self.folder.is_dir():
            raise _SourceFailed(f"{self.folder}: no such folder")
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise _SourceFailed(f"{self.folder}: no image files ({', '.join(IMAGE_SUFFIXES)})")
        self.index = 0

    def read(self, seq: int) -> tuple[np.ndarray, None, str] | None:
        if self.index >= len(self.files):
            return None
        path = self.files[self.index]
        self.index += 1
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise _BadFrame("bad_frames", f"{path}: cannot decode image")
        return image, None, f"images:{path}"


class _ZmqSource(_Source):
    """PULL socket that connects to a remote PUSH. A frame keeps its remote seq and capture
    time (the reader re-stamps one too far from its own clock); its deadline is that time
    plus this camera's staleness_ms."""

    # What may wait for this reader: one frame in libzmq and SO_RCVBUF bytes in the kernel
    # (the camera's receive_buffer_bytes, which the kernel doubles; left to autotuning it
    # grows to net.ipv4.tcp_rmem's maximum, 32 MiB on some hosts), so a reader that falls
    # behind makes the sender drop at its source (zmq_push's peer_slow) instead of frames
    # ageing in buffers (docs/benchmarks.md).
    RCVHWM = 1
    POLL_MS = 50

    def __init__(
        self,
        endpoint: str,
        stop: threading.Event,
        curve: Curve | None,
        camera: str,
        stall_timeout_s: float,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        receive_buffer_bytes: int = DEFAULT_RECEIVE_BUFFER_BYTES,
    ):
        self.endpoint = endpoint
        self.max_pixels = max_pixels
        self.receive_buffer_bytes = receive_buffer_bytes
        # The largest part a frame of max_pixels needs (its raw payload) and room for a JPEG's
        # tables on tiny frames: ZeroMQ drops a peer that sends more instead of allocating it.
        self.max_message_bytes = max_pixels * 3 + 65536
        self.description = f"zmq:{endpoint}"
        self.stop = stop
        self.stall_timeout_s = stall_timeout_s
        self.curve = curve
        self.camera = camera
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None

    def open(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, self.RCVHWM)
        self.sock.setsockopt(zmq.RCVBUF, self.receive_buffer_bytes)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        try:
            SocketSecurity(self.ctx, self.curve, f"camera {self.camera}").connect(
                self.sock, self.endpoint
            )
        except zmq.ZMQError as exc:
            self.close()
            raise _SourceFailed(f"cannot connect to {self.endpoint}: {exc}") from None

    def read(self, seq: int) -> tuple[np.ndarray, int, str, int] | None:
        """The next frame (image, capture time, description, the sender's seq); None after
        stop, or after 0.9 * stall_timeout_s without one (the reader's "stalled" mark), with
        the socket already closed: a frame sent once the camera shows "stale" then waits for
        the reopened socket instead of being lost."""
        give_up = time.monotonic() + 0.9 * self.stall_timeout_s
        while not self.stop.is_set():
            left_ms = (give_up - time.monotonic()) * 1000
            if not self.sock.poll(max(0, min(self.POLL_MS, left_ms)), zmq.POLLIN):
                if left_ms <= 0:
                    self.close()
                    return None
                continue
            # copy=False: a raw image is a view of the message's memory (stages.frame_wire).
            parts = self.sock.recv_multipart(copy=False)
            try:
                remote = decode_frame(parts, self.max_pixels)
            except FrameWireError as exc:
                raise _BadFrame("bad_messages", str(exc)) from None
            if remote.seq >= MAX_WIRE_SEQ:
                raise _BadFrame("bad_messages", f"frame seq {remote.seq} is not below 2^53")
            return (
                remote.image,
                remote.capture_ts_ns,
                f"{self.description} {remote.camera}#{remote.seq} ({remote.source})",
                remote.seq,
            )
        return None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None


class _SyntheticSource(_Source):
    def __init__(self, width: int, height: int, fps: float):
        self.width, self.height = width, height
        self.native_fps = fps
        self.description = f"synthetic:{width}x{height}@{fps:g}"

    def open(self) -> None:
        pass

    def read(self, seq: int) -> tuple[np.ndarray, None, str]:
        return synthetic_image(seq, self.width, self.height), None, self.description


def synthetic_image(seq: int, width: int, height: int) -> np.ndarray:
    """The synthetic source's frame seq: uint8 [height, width, 3] BGR, a function of its args.

    A diagonal gradient scrolls with seq, a white square crosses the frame, and seq is
    written in the top-left corner.
    """
    y, x = np.mgrid[0:height, 0:width]
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = (x + 3 * seq) % 256
    image[..., 1] = (y + 2 * seq) % 256
    image[..., 2] = ((x + y) // 2) % 256
    side = max(4, min(width, height) // 6)
    x0 = (seq * 5) % max(1, width - side)
    y0 = (height - side) // 2
    image[y0 : y0 + side, x0 : x0 + side] = 255
    scale = max(0.4, height / 240)
    cv2.putText(
        image,
        str(seq),
        (4, int(24 * scale)),
        cv2.FONT_HERSHEY_SIMPLEX,
        0.7 * scale,
        (0, 0, 0),
        max(1, int(2 * scale)),
    )
    return image


def make_source(spec: CameraSpec, stop: threading.Event) -> _Source:
    """The source object of spec (not opened yet); SourceError if a sample is not fetched."""
    kind, target = spec._parsed
    if kind == "file":
        if target[0] == "sample":
            try:
                assets.asset_path(target[1])
            except assets.AssetError as exc:
                raise spec._error(str(exc)) from None
        return _FileSource(spec.path)
    if kind == "images":
        return _ImageFolderSource(spec.path)
    if kind == "usb":
        return _CaptureSource(target, f"usb:{target}")
    if kind == "stream":
        timeout_ms = int(spec.stall_timeout_s * 1000)
        # A read that times out leaves FFmpeg's context dead, so the read timeout is the stall
        # timeout itself: the stream is reopened exactly when it counts as stalled.
        params = [
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            timeout_ms,
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            timeout_ms,
        ]
        return _CaptureSource(target, redact(target), params)
    if kind == "zmq":
        return _ZmqSource(
            target,
            stop,
            spec.curve,
            spec.name,
            spec.stall_timeout_s,
            spec.max_pixels,
            spec.receive_buffer_bytes,
        )
    return _SyntheticSource(int(target["width"]), int(target["height"]), float(target["fps"]))


class CameraReader:
    """Reads one camera on its own thread and calls emit(frame) for every frame.

    emit may block (the back-pressure of a `block` queue); it must return promptly once the
    engine stops. It returns False for a frame the engine did not take (it is stopping):
    counted as `refused`, so `frames` = frames taken + `refused`. health is one of
    HEALTH_STATES; stats() is a snapshot for metrics.
    """

    def __init__(
        self, spec: CameraSpec, emit: Callable[[Frame], bool | None], clock: Clock = SYSTEM
    ) -> None:
        self.spec = spec
        self.emit = emit
        self._clock = clock
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
        }
        self._last_grab_ns: int | None = None
        self._frame_size: tuple[int, int] | None = None
        self._last_error: str | None = None
        self._seq = 0
        # A paced source's next read (monotonic s), kept across a looping file's reopen so
        # the first frame of the next pass takes the slot after the last one.
        self._due = 0.0
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
                except _SourceFailed as exc:
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
        period = 1.0 / rate if paced else 0.0
        self._due = max(self._clock.monotonic(), self._due)
        flowed = False
        failed_reads = 0
        while not self._stop.is_set():
            # A read that delivers nothing (the end of a file, before the next pass) leaves
            # its slot to the next read: a looping file does not pause at its end.
            if paced and not failed_reads:
                delay = self._due - self._clock.monotonic()
                if delay > 0 and self._clock.wait(self._stop, delay):
                    break
                self._due = max(self._due + period, self._clock.monotonic() - period)
            started = self._reading_since = self._clock.monotonic()
            try:
                item = self._source.read(self._seq)
            except _BadFrame as exc:
                self._skipped(exc.key, str(exc))
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
            capture_ns = grab_ns if capture_ns is None else self._trusted(capture_ns, grab_ns)
            seq = own_seq[0] if own_seq else self._seq
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

    def _trusted(self, capture_ns: int, grab_ns: int) -> int:
        """A capture time the source sent (zmq: the sender's clock), or the arrival time
        when it is further than max_clock_skew_ms from it: one frame stamped a day ahead
        must not hold the camera's deadlines and tracks a day ahead (counted, logged)."""
        skew_ns = capture_ns - grab_ns
        if abs(skew_ns) <= self.spec.max_clock_skew_ms * 1_000_000:
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
