"""A camera as the reader sees it (CameraSpec): its name, url and reading options, checked
when made, its url parsed by the registered kind owning its scheme (registry.py), so a bad
one is a SourceError naming the camera and url."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import DEFAULT_MAX_PIXELS, DEFAULT_RECEIVE_BUFFER_BYTES
from pipeline.errors import NpucamError
from pipeline.security import Curve
from stages.source_kinds import registry
from stages.source_kinds.registry import SourceKind


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

    Once checked: source_kind, the registered SourceKind owning the url's scheme, and
    target, what it parsed from the url (its own type: a path, an index, an endpoint...).
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
                raise self.error(f"{key} must be a positive number, got {value!r}")
        if self.fps is not None and (
            isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)) or not self.fps > 0
        ):
            raise self.error(f"fps must be a positive number, got {self.fps!r}")
        if self.reconnect_min_s > self.reconnect_max_s:
            raise self.error(
                f"reconnect_min_s ({self.reconnect_min_s}) exceeds reconnect_max_s "
                f"({self.reconnect_max_s})"
            )
        if self.end not in (None, "stop", "reconnect"):
            raise self.error(f"end must be 'stop' or 'reconnect', got {self.end!r}")
        if type(self.max_pixels) is not int or self.max_pixels < 1:
            raise self.error(f"max_pixels must be a positive integer, got {self.max_pixels!r}")
        if type(self.receive_buffer_bytes) is not int or self.receive_buffer_bytes < 1:
            got = self.receive_buffer_bytes
            raise self.error(f"receive_buffer_bytes must be a positive integer, got {got!r}")
        self.source_kind, self.target = _parse_url(self)

    @property
    def kind(self) -> str:
        """The name of its SourceKind: file, usb, stream, images, zmq, synthetic, or one a
        plugin registered."""
        return self.source_kind.name

    @property
    def live(self) -> bool:
        """True for sources that deliver at their own pace (usb, stream, zmq)."""
        return self.source_kind.live

    @property
    def path(self) -> Path | None:
        """The file or folder a file, sample or images source reads (it may not exist yet);
        None for other kinds."""
        return self.source_kind.path(self)

    @property
    def reconnects(self) -> bool:
        """Whether a failure or end of this source reopens it (the `end` policy)."""
        if self.end is None:
            return self.live
        return self.end == "reconnect"

    def error(self, what: str) -> SourceError:
        """A SourceError naming this camera and its url (password redacted)."""
        return SourceError(f"camera {self.name!r} ({redact(self.url)}): {what}")


def redact(url: str) -> str:
    """url with any password replaced by ***, for logs and frame descriptions."""
    return re.sub(r"(://[^/:@]*:)[^/]*@", r"\1***@", url, count=1)


def _parse_url(spec: CameraSpec) -> tuple[SourceKind, Any]:
    """(kind, target) of spec.url: the registered kind owning its scheme parses the rest; a
    url without a scheme is a file path (a one-letter scheme is a Windows drive)."""
    url = spec.url.strip()
    scheme, sep, rest = url.partition(":")
    scheme = scheme.lower() if sep else ""
    kind = registry.for_scheme(scheme) if scheme else None
    if kind is not None:
        return kind, kind.parse(spec, scheme, rest)
    if "://" in url or (sep and re.fullmatch(r"[a-z][a-z0-9+.-]+", scheme)):
        raise spec.error(f"unknown source scheme {scheme!r}; expected {registry.forms()}")
    kind = registry.for_scheme("")
    if kind is None:
        raise spec.error("no registered source kind reads file paths")
    return kind, kind.parse(spec, "", url)
