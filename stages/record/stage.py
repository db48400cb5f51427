"""The `record` stage (docs/recording.md): each camera's frames as JPEGs in segmented MJPEG
streams with a seq / capture-time sidecar (frame_log.py), and every message a publish stage of
the run sends, byte for byte with its receive time, in segmented logs (message_log.py); the
recording folder bounded by size and age (retention.py). A write that fails (disk full,
read-only folder) or finds no room drops its item, counted `storage`: the pipeline never waits
on the disk beyond the item being written, and never stops for it. With `blur_faces`, a frame
is stored only once the detect stage's Detections of it arrived, its faces blurred
(privacy.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from pydantic import Field

from pipeline.config import Config
from pipeline.graph import Context, Outbox, Stage, StageOptions
from pipeline.messages import Detections, Frame, now_ns
from pipeline.queues import BoundedQueue
from stages import publish
from stages.record import frame_log, message_log, privacy
from stages.record.clips import CLIPS_DIR, ClipRule, EventClips
from stages.record.retention import Retention, disk_free, existing_segments
from stages.record.segments import SegmentedLog

log = logging.getLogger(__name__)

INDEX_LINE_BYTES = 64  # a sidecar line at most: four integers of up to 19 digits, 3 commas
NO_DETECTIONS = ("capture", "stages.capture:Capture", "publish", "stages.publish:Publish")
MESSAGE_POLL_S = 0.2  # the message writer's wake-up when idle: expiry by age, stop


class RecordOptions(StageOptions):
    path: str = Field(min_length=1)  # the recordings folder; the session is a folder in it
    session: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")  # None: the UTC start time
    cameras: list[str] | None = None  # None: every camera whose frames reach the stage
    frames: bool = True
    messages: str | None = None  # the publish stage whose messages to log; None: the only one
    jpeg_quality: int = Field(90, ge=1, le=100)
    segment_s: float = Field(60.0, gt=0)
    segment_bytes: int = Field(64 << 20, ge=1 << 16)
    max_bytes: int = Field(10 << 30, ge=1 << 18)
    max_age_s: float | None = Field(None, gt=0)
    min_free_bytes: int = Field(512 << 20, ge=0)  # the disk keeps this free; 0: no check
    message_queue: int = Field(10_000, ge=1)  # messages waiting for the writer thread
    retry_s: float = Field(5.0, gt=0)  # after a failed write, the next try of a segment
    blur_faces: bool = False  # store a frame once detect's Detections came, faces blurred
    blur_margin: float = Field(0.2, ge=0, le=2)  # of a face box's size, added on each side
    blur_wait_frames: int = Field(30, ge=1)  # frames of a camera waiting for their Detections
    clips: list[ClipRule] = []  # event clips (clips.py), announced on events/<camera>


class Record(Stage[RecordOptions]):
    """Frames -> segmented MJPEG + sidecar; the publish stage's messages -> segmented logs."""

    kind = "record"
    accepts = (Frame, Detections)
    Options = RecordOptions

    def __init__(self, name: str, options: RecordOptions, context: Context) -> None:
        super().__init__(name, options, context)
        root = Path(options.path).expanduser()
        if not root.is_absolute():
            root = context.config.base_dir / root
        self.root = root
        self.session = root / (options.session or _unique_session(root))
        self.retention = Retention(
            options.max_bytes,
            options.max_age_s,
            min_free_bytes=options.min_free_bytes,
            free_bytes=disk_free(root),
        )
        self.retention.adopt(
            existing_segments(
                root, (frame_log.VIDEO_SUFFIX, frame_log.INDEX_SUFFIX), message_log.MESSAGE_SUFFIX
            )
        )
        self.frame_logs: dict[str, SegmentedLog] = {}
        self.message_log: SegmentedLog | None = None
        self._messages: queue.Queue = queue.Queue(options.message_queue)
        self.messages_dropped = 0  # at a full message_queue
        self._stop_messages = threading.Event()
        self.faces = privacy.FaceJoin(options.blur_wait_frames) if options.blur_faces else None
        self.unblurred_dropped = 0  # frames never stored: their Detections did not come
        publisher = _publisher(context.config, options.messages)
        self.taps = None if publisher is None else publish.taps(context, publisher)
        if self.taps is not None:
            self.message_log = self._log(
                self.session / message_log.MESSAGES_DIR,
                message_log.MessageSegmentWriter,
                (message_log.MESSAGE_SUFFIX,),
            )
            self.taps.callables.append(self._tap)
        self.clips = (
            EventClips(self.session / CLIPS_DIR, tuple(options.clips), self.retention)
            if options.clips
            else None
        )
        # events go to the publish stage, which then waits for this stage to end: this stage
        # cannot wait for its final stats
        names = context.config.stage_names
        self._feeds_publisher = publisher is not None and publisher in _targets(
            context.config, names.index(name)
        )
        self.metrics.add_gauges(self.name, self._gauges)

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        options = config.stages[index].options
        problems = []
        segment, cap = options.get("segment_bytes", 64 << 20), options.get("max_bytes", 10 << 30)
        if type(segment) is int and type(cap) is int and segment * 4 > cap:
            problems.append(
                f"stages[{index}].segment_bytes: {segment} is over a quarter of max_bytes "
                f"({cap}): retention needs closed segments to delete to stay under the cap"
            )
        names = [c.name for c in config.cameras]
        for camera in options.get("cameras") or []:
            if camera not in names:
                problems.append(f"stages[{index}].cameras: no camera named {camera!r}")
        wanted = options.get("messages")
        publishers = _publishers(config)
        if wanted is not None and wanted != "" and wanted not in publishers:
            problems.append(
                f"stages[{index}].messages: no publish stage named {wanted!r} "
                f"(publish stages: {', '.join(publishers) or 'none'})"
            )
        if options.get("blur_faces") is True and not _detections_senders(config, index):
            problems.append(
                f"stages[{index}].blur_faces: no stage but capture sends to this stage, so no "
                f"Detections come (add {config.stage_names[index]!r} to the detect stage's "
                "`to`): no frame could be stored"
            )
        if options.get("clips") and options.get("frames") is False:
            problems.append(f"stages[{index}].clips: clips are of frames: needs frames = true")
        if options.get("clips") and (
            _publisher(config, wanted) is None
            or _publisher(config, wanted) not in _targets(config, index)
        ):
            problems.append(
                f"stages[{index}].clips: events need the publish stage whose messages this "
                "stage logs, in this stage's `to` (they trigger the clips and carry events/)"
            )
        if wanted is None and len(publishers) > 1:
            problems.append(
                f"stages[{index}].messages: the config has several publish stages "
                f"({', '.join(publishers)}): name the one to record"
            )
        return problems

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
        log.info("record %s: recording to %s", self.name, self.session)
        writer = None
        if self.message_log is not None:
            writer = threading.Thread(
                target=self._write_messages, name=f"record-{self.name}-messages", daemon=True
            )
            writer.start()
        try:
            async for item in inbox:
                if not self.options.frames or (
                    self.options.cameras is not None and item.camera not in self.options.cameras
                ):
                    continue
                if self.faces is None:
                    if isinstance(item, Frame):
                        await self._store(item, None, out)
                    continue
                if isinstance(item, Frame):
                    ready, given_up = self.faces.frame(item)
                else:
                    ready, given_up = self.faces.detections(item)
                self._unblurred(given_up)
                for frame, faces in ready:
                    await self._store(frame, faces, out)
            if self.faces is not None:
                self._unblurred(self.faces.pending())
            if self.clips is not None:
                self.clips.close_all()
                await self._send_events(out)
            if self.taps is not None and not self._feeds_publisher:
                # the publish stage sends its final stats after its inbox drained
                timeout = self.context.config.pipeline.drain_timeout_s
                await asyncio.to_thread(self.taps.done.wait, timeout)
        finally:
            self._stop_messages.set()
            if writer is not None:
                await asyncio.to_thread(writer.join)
            for frames in self.frame_logs.values():
                frames.close()

    async def _store(self, frame: Frame, faces: np.ndarray | None, out: Outbox) -> None:
        start = time.perf_counter()
        if await asyncio.to_thread(self.store_frame, frame, faces):
            self.metrics.did(self.name, frame.camera, time.perf_counter() - start)
        else:
            self.metrics.drop(self.name, frame.camera, "storage")
        await self._send_events(out)

    async def _send_events(self, out: Outbox) -> None:
        if self.clips is not None:
            for event in self.clips.take():
                await out.send(event)

    def _unblurred(self, frames: list[Frame]) -> None:
        for frame in frames:
            self.unblurred_dropped += 1
            self.metrics.drop(self.name, frame.camera, "storage")

    def store_frame(self, frame: Frame, faces: np.ndarray | None = None) -> bool:
        """Encode and write one frame (a worker thread), its face boxes (float32 [F, 4] px,
        or None) blurred first; False when it was not stored."""
        frames = self.frame_logs.get(frame.camera)
        if frames is None:
            folder = self.session / frame_log.FRAMES_DIR / frame.camera
            suffixes = (frame_log.VIDEO_SUFFIX, frame_log.INDEX_SUFFIX)
            frames = self.frame_logs[frame.camera] = self._log(
                folder, frame_log.FrameSegmentWriter, suffixes
            )
        image = frame.image
        if faces is not None:
            image = privacy.blur_boxes(image, faces, self.options.blur_margin)
        jpeg = frame_log.encode_jpeg(image, self.options.jpeg_quality)
        if self.clips is not None:
            self.clips.frame(frame.camera, frame.seq, frame.capture_ts_ns, jpeg)
        size = len(jpeg) + INDEX_LINE_BYTES + len(frame_log.INDEX_HEADER)
        return frames.write(
            size, lambda writer: writer.append(frame.seq, frame.capture_ts_ns, jpeg)
        )

    def _log(self, folder: Path, make: Callable, suffixes: tuple[str, ...]) -> SegmentedLog:
        return SegmentedLog(
            folder,
            make,
            suffixes,
            self.retention,
            self.options.segment_bytes,
            self.options.segment_s,
            self.options.retry_s,
        )

    def _tap(self, parts: list) -> None:
        """From the publish stage, on the loop: never waits."""
        try:
            self._messages.put_nowait((now_ns(), parts))
        except queue.Full:
            self.messages_dropped += 1
            self.metrics.drop(self.name, "", "queue_full")

    def _write_messages(self) -> None:
        assert self.message_log is not None
        while True:
            try:
                ts, parts = self._messages.get(timeout=MESSAGE_POLL_S)
            except queue.Empty:
                if self._stop_messages.is_set():
                    break
                self.retention.expire()
                continue
            record = message_log.encode_record(ts, parts)
            stored = self.message_log.write(
                len(record) + len(message_log.MAGIC), functools.partial(_append, record)
            )
            if not stored:
                self.metrics.drop(self.name, "", "storage")
            if self.clips is not None:
                self.clips.message(parts)
        self.message_log.close()

    def _gauges(self) -> dict[str, float]:
        logs = [*self.frame_logs.values(), *([self.message_log] if self.message_log else [])]
        return {
            "bytes": self.retention.used,
            "segments": self.retention.segments(),
            "segments_deleted": self.retention.deleted,
            "write_failures": sum(x.failures for x in logs),
            "over_cap": sum(x.over_cap for x in logs),
            "messages_waiting": self._messages.qsize(),
            "unblurred_dropped": self.unblurred_dropped,
            "clip_frames_skipped": 0 if self.clips is None else self.clips.skipped,
        }


def _append(record: bytes, writer: message_log.MessageSegmentWriter) -> int:
    return writer.append(record)


def _detections_senders(config: Config, index: int) -> list[str]:
    """The stages whose output goes to stages[index] (`to`, or by default the next stage),
    but capture (frames) and publish (nothing)."""
    name, names = config.stage_names[index], config.stage_names
    senders = []
    for i, stage in enumerate(config.stages):
        if name in _targets(config, i) and stage.kind not in NO_DETECTIONS:
            senders.append(names[i])
    return senders


def _targets(config: Config, index: int) -> list[str]:
    """Where stages[index] sends its output: its `to`, or by default the next stage."""
    stage = config.stages[index]
    return stage.to if stage.to is not None else config.stage_names[index + 1 : index + 2]


def _publishers(config: Config) -> list[str]:
    return [
        name
        for name, stage in zip(config.stage_names, config.stages, strict=True)
        if stage.kind in ("publish", "stages.publish:Publish")
    ]


def _publisher(config: Config, wanted: str | None) -> str | None:
    """The publish stage whose messages to log: `messages`, or the config's only one ("" or
    no publish stage: none)."""
    if wanted is not None:
        return wanted or None
    publishers = _publishers(config)
    return publishers[0] if len(publishers) == 1 else None


def _unique_session(root: Path) -> str:
    """The start time in UTC (20261203-181500), with -2, -3... if that folder exists."""
    base = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    name, n = base, 1
    while (root / name).exists():
        n += 1
        name = f"{base}-{n}"
    return name
