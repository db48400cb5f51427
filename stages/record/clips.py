"""Event clips (the record stage's `clips`): a published message that matches a rule (a topic
prefix, and optionally a header field that is set) opens a clip of its camera's frames from
`pre_s` before its capture time to `post_s` after it (a message naming `cameras`, as a rig's
pose3d does: one clip of each); a later match while the clip is open extends it. The pre-roll
comes from a ring of the camera's last frames (the JPEGs the recorder coded, so a blurred
frame stays blurred); a clip is a frame segment of its own (frame_log.py) in
`<session>/clips/NNNNNN-<camera>/`, counted by the recording's retention, and each closed clip
is announced as an `events/<camera>` message (ClipEvent)."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pipeline.messages import Result
from stages.record.frame_log import INDEX_HEADER, FrameSegmentWriter
from stages.record.retention import Retention, Segment

CLIPS_DIR = "clips"
LINE_BYTES = 64  # a sidecar line at most (stage.INDEX_LINE_BYTES)


class ClipRule(BaseModel):
    """One kind of event: messages whose topic starts with `topic` (and whose header has
    `field` set: not missing, null, false, 0 or empty)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    topic: str = Field(min_length=1)
    field: str | None = Field(None, min_length=1)
    pre_s: float = Field(5.0, ge=0, le=60)
    post_s: float = Field(5.0, ge=0, le=600)


@dataclass(slots=True, kw_only=True)
class ClipEvent(Result):
    """A closed clip, published on `events/<camera>`: seq is the clip's number, capture_ts its
    first trigger's capture time; the header's `clip` the folder (relative to the session),
    `start_ts` / `end_ts` the capture times of its first and last frames, `frames`, `trigger`
    the first trigger's topic and `triggers` how many messages matched while it was open."""

    kind: str = "events"


@dataclass
class _Open:
    number: int
    camera: str
    writer: FrameSegmentWriter
    segment: Segment
    trigger: str
    trigger_ts: int
    end_ts: int
    triggers: int = 1
    first_ts: int | None = None
    last_ts: int | None = None
    frames: int = 0


@dataclass
class EventClips:
    """Clips of one session; frame() from the frame thread, message() from the message
    thread. `closed` holds the ClipEvents of clips closed since the last take()."""

    folder: Path
    rules: tuple[ClipRule, ...]
    retention: Retention
    _ring: dict[str, deque[tuple[int, int, bytes]]] = field(default_factory=dict)
    _open: dict[str, _Open] = field(default_factory=dict)
    _closed: list[ClipEvent] = field(default_factory=list)
    _count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    skipped: int = 0  # clip frames that found no room under max_bytes

    @property
    def _pre_ns(self) -> int:
        return int(max(r.pre_s for r in self.rules) * 1e9)

    def frame(self, camera: str, seq: int, capture_ts: int, jpeg: bytes) -> None:
        """A coded frame of `camera`: into its ring, and into its open clip (which it may
        close)."""
        with self._lock:
            ring = self._ring.setdefault(camera, deque())
            ring.append((seq, capture_ts, jpeg))
            while ring and ring[0][1] < capture_ts - self._pre_ns:
                ring.popleft()
            clip = self._open.get(camera)
            if clip is None:
                return
            if capture_ts > clip.end_ts:
                self._close(clip)
            else:
                self._write(clip, seq, capture_ts, jpeg)

    def message(self, parts: list) -> None:
        """A published message: a trigger if it matches a rule."""
        topic = bytes(parts[0]).decode(errors="replace")
        rules = [r for r in self.rules if topic.startswith(r.topic)]
        if not rules or len(parts) < 2:
            return
        try:
            header = json.loads(bytes(parts[1]))
            camera, capture_ts = header["camera"], int(header["capture_ts"])
        except (ValueError, KeyError, TypeError):
            return
        # a rig's message (pose3d) names the rig: its clips are of the rig's cameras
        cameras = header.get("cameras")
        if not (isinstance(cameras, list) and all(isinstance(c, str) for c in cameras)):
            cameras = [camera]
        for rule in rules:
            if rule.field is None or header.get(rule.field):
                for each in cameras:
                    self._trigger(rule, topic, each, capture_ts)
                return

    def take(self) -> list[ClipEvent]:
        """The clips closed since the last call."""
        with self._lock:
            closed, self._closed = self._closed, []
            return closed

    def close_all(self) -> None:
        with self._lock:
            for clip in list(self._open.values()):
                self._close(clip)

    def _trigger(self, rule: ClipRule, topic: str, camera: str, capture_ts: int) -> None:
        end = capture_ts + int(rule.post_s * 1e9)
        with self._lock:
            clip = self._open.get(camera)
            if clip is not None:
                clip.end_ts = max(clip.end_ts, end)
                clip.triggers += 1
                return
            self._count += 1
            name = f"{self._count:06d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', camera)}"
            folder = self.folder / name
            try:
                folder.mkdir(parents=True, exist_ok=True)
                writer = FrameSegmentWriter(folder / "000001")
            except OSError:
                self.skipped += 1
                return
            segment = self.retention.open((writer.video_path, writer.index_path))
            clip = self._open[camera] = _Open(
                self._count, camera, writer, segment, topic, capture_ts, end
            )
            start = capture_ts - int(rule.pre_s * 1e9)
            for seq, ts, jpeg in self._ring.get(camera, ()):
                if start <= ts <= end:
                    self._write(clip, seq, ts, jpeg)

    def _write(self, clip: _Open, seq: int, ts: int, jpeg: bytes) -> None:
        first = clip.frames == 0 and clip.segment.bytes == 0
        n = len(jpeg) + LINE_BYTES + (len(INDEX_HEADER) if first else 0)
        if not self.retention.reserve(n):
            self.skipped += 1
            return
        before = 0 if first else clip.writer.bytes
        written = 0
        try:
            clip.writer.append(seq, ts, jpeg)
            written = clip.writer.bytes - before
        except OSError:
            self.skipped += 1
        finally:
            self.retention.settle(clip.segment, n, written)
        if written:
            clip.frames += 1
            clip.first_ts = ts if clip.first_ts is None else clip.first_ts
            clip.last_ts = ts

    def _close(self, clip: _Open) -> None:
        del self._open[clip.camera]
        with contextlib.suppress(OSError):  # what it holds stays readable
            clip.writer.close()
        self.retention.close(clip.segment)
        self._closed.append(
            ClipEvent(
                camera=clip.camera,
                seq=clip.number,
                capture_ts_ns=clip.trigger_ts,
                deadline_ns=1 << 62,  # an announcement, never stale
                extra={
                    "clip": f"{CLIPS_DIR}/{clip.writer.video_path.parent.name}",
                    "start_ts": clip.first_ts,
                    "end_ts": clip.last_ts,
                    "frames": clip.frames,
                    "trigger": clip.trigger,
                    "triggers": clip.triggers,
                },
            )
        )
