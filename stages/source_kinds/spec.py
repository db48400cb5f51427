"""A camera as the reader sees it (CameraSpec): its name, url and reading options, checked
and parsed when made, so a bad one is a SourceError naming the camera and url."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import assets
from pipeline.config import DEFAULT_MAX_PIXELS, DEFAULT_RECEIVE_BUFFER_BYTES
from pipeline.errors import NpucamError
from pipeline.security import Curve

LIVE_KINDS = ("usb", "stream", "zmq")
STREAM_SCHEMES = ("rtsp", "rtsps", "http", "https")
SYNTHETIC_DEFAULTS = {"width": 320, "height": 240, "fps": 25.0}


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
