"""The capture stage: one stages.sources.CameraReader thread per configured camera, feeding
the pipeline's first queues.

Readers timestamp, number and pace frames (stages/sources.py); this stage turns [[cameras]]
into CameraSpecs, hands every frame to the outbox from the reader's thread (waiting only for
`block` inboxes, and never once the pipeline is stopping), reports each camera's stats
(fps, health, reconnects...) to the metrics, and ends when every camera has ended or the
runner calls stop(). One camera failing never stops the others. A frame grabbed that no inbox
takes (the pipeline is stopping, or its queue closed) is counted in the camera's `refused`,
so a camera's `frames` are this stage's `out` for it plus `refused`. A camera whose source
never opened is an error naming the camera and its source; when no camera ever opened, the
stage fails (CaptureError: `npucam run` exits 1). A `synchronized` stage plays its paced
cameras on one timeline (frame k of each read and stamped at one instant): a rig of
recorded files groups frame by frame, as the cameras that filmed them did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from pipeline import security
from pipeline.clock import SYSTEM
from pipeline.config import CameraConfig, Config
from pipeline.errors import NpucamError
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.messages import Frame
from pipeline.queues import BoundedQueue
from pipeline.security import Curve
from pipeline.startup import Startup
from stages.sources import CameraReader, CameraSpec, SharedTimeline, SourceError, redact

log = logging.getLogger(__name__)

# How often the stage looks whether every camera has ended; readers have no end callback.
END_POLL_S = 0.2
READER_STOP_TIMEOUT_S = 2.0


class CaptureError(NpucamError):
    """No camera of the stage could ever be opened; the text names each and why."""


# A synchronized stage's frame 0 is due this long after it starts: the files open meanwhile,
# so every camera's first frame is frame 0 (one that opens later skips to the current slot).
SYNC_START_S = 0.5


class CaptureOptions(StageOptions):
    cameras: list[str] | None = None  # names of the [[cameras]] this stage reads; None = all
    # its cameras (all paced: files, folders, the test card) play on one timeline: frame k
    # of each is read at, and stamped, start + k/fps (stages/sources.py SharedTimeline)
    synchronized: bool = False


def camera_spec(camera: CameraConfig, config: Config, curve: Curve | None = None) -> CameraSpec:
    """The reader's view of one [[cameras]] entry; relative paths resolve against the
    config file's directory. curve: the keys a zmq: camera connects with."""
    return CameraSpec(
        name=camera.name,
        url=camera.url,
        base_dir=config.base_dir,
        loop=camera.loop,
        realtime=camera.realtime,
        fps=camera.fps,
        staleness_ms=camera.staleness_ms,
        stall_timeout_s=camera.stall_timeout_s,
        reconnect_min_s=camera.reconnect_min_s,
        reconnect_max_s=camera.reconnect_max_s,
        end=camera.end,
        curve=curve,
        max_clock_skew_ms=camera.max_clock_skew_ms,
        max_pixels=camera.max_pixels,
        receive_buffer_bytes=camera.receive_buffer_bytes,
    )


def camera_curve(camera: CameraConfig, config: Config) -> Curve | None:
    """The CURVE keys of a zmq: camera's connecting socket (None: plain, or not zmq)."""
    if not camera.url.startswith("zmq:"):
        return None
    index = config.cameras.index(camera)
    return security.curve_for(
        config,
        bind=False,
        socket=f"camera {camera.name}",
        override=camera.security,
        override_key=f"cameras[{index}].security",
    )


class Capture(Stage[CaptureOptions]):
    """Source stage: frames from every selected camera."""

    kind = "capture"
    accepts = ()
    Options = CaptureOptions

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.readers: dict[str, CameraReader] = {}
        self._stopping = threading.Event()
        self._stop_requested = asyncio.Event()  # stop() may come before run() has begun

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        problems = []
        wanted = config.stages[index].options.get("cameras")
        names = [c.name for c in config.cameras]
        for j, name in enumerate(wanted or []):
            if name not in names:
                problems.append(f"stages[{index}].cameras[{j}]: no camera named {name!r}")
        synchronized = config.stages[index].options.get("synchronized") is True
        if not config.cameras:
            problems.append("cameras: a capture stage needs at least one [[cameras]] entry")
        for i, cam in enumerate(config.cameras):
            try:
                spec = camera_spec(cam, config)
            except SourceError as exc:
                problems.append(f"cameras[{i}].url: {exc}")
                continue
            missing = spec.source_kind.missing(spec)
            if missing:
                problems.append(f"cameras[{i}].url: {missing}")
            if synchronized and (wanted is None or cam.name in wanted):
                if spec.live or not spec.realtime:
                    problems.append(
                        f"stages[{index}].synchronized: camera {cam.name!r} is "
                        + ("live" if spec.live else "not paced (realtime = false)")
                        + ": only paced files, folders and the test card share a timeline"
                    )
                elif spec.kind == "images" and cam.fps is None:
                    problems.append(
                        f"cameras[{i}].fps: camera {cam.name!r} is a folder in a synchronized "
                        "capture stage: it needs an fps to have slots on the timeline"
                    )
            if spec.kind != "zmq" and cam.security is not None:
                problems.append(f"cameras[{i}].security: only zmq: cameras open a socket to secure")
            if spec.kind != "zmq" and "max_pixels" in cam.model_fields_set:
                problems.append(f"cameras[{i}].max_pixels: only zmq: cameras check frame sizes")
            if spec.kind == "zmq":
                problems.extend(
                    security.check_curve(
                        config,
                        bind=False,
                        socket=f"camera {cam.name}",
                        override=cam.security,
                        override_key=f"cameras[{i}].security",
                    )
                )
        return problems

    def selected(self) -> list[CameraConfig]:
        wanted = self.options.cameras
        return [c for c in self.context.config.cameras if wanted is None or c.name in wanted]

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        if not await self._stages_open():
            return
        timeline = (
            SharedTimeline.starting_in(SYSTEM, SYNC_START_S) if self.options.synchronized else None
        )
        for cam in self.selected():
            config = self.context.config
            spec = camera_spec(cam, config, camera_curve(cam, config))
            reader = CameraReader(spec, self._emitter(out), timeline=timeline)
            self.readers[cam.name] = reader
            self.metrics.add_camera(cam.name, reader.stats)
        for reader in self.readers.values():
            reader.start()
        log.info(
            "capture %s: %s",
            self.name,
            ", ".join(f"{n} ({redact(r.spec.url)})" for n, r in self.readers.items()),
        )
        try:
            while not self._stop_requested.is_set():
                if all(r.health == "ended" for r in self.readers.values()):
                    log.info("capture %s: every camera has ended", self.name)
                    self._check_opened()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_requested.wait(), END_POLL_S)
        finally:
            self._stopping.set()
            await asyncio.to_thread(self._stop_readers)

    async def _stages_open(self) -> bool:
        """Wait until the stages that load models have (pipeline/startup.py): frames read
        meanwhile would wait in the inboxes, or be dropped as stale, and the reading would
        slow the loading. False if the run stopped first."""
        startup = Startup.of(self.context)
        if startup.opening:
            log.info("capture %s: reading once %s open", self.name, ", ".join(startup.opening))
        opened = asyncio.ensure_future(startup.wait())
        stopped = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({opened, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
            stopped.cancel()
        return not self._stop_requested.is_set()

    def _check_opened(self) -> None:
        never = {n: r for n, r in self.readers.items() if not r.opened}
        for name, reader in never.items():
            log.error(
                "capture %s: camera %s never opened %s: %s",
                self.name,
                name,
                redact(reader.spec.url),
                reader.stats()["last_error"],
            )
        if never and len(never) == len(self.readers):
            raise CaptureError(
                f"capture {self.name}: no camera could be opened: "
                + "; ".join(
                    f"{n} ({redact(r.spec.url)}): {r.stats()['last_error']}"
                    for n, r in never.items()
                )
            )

    def _emitter(self, out: Outbox):
        stopping = self._stopping.is_set

        def emit(frame: Frame) -> bool:
            return not stopping() and out.send_threadsafe(frame, give_up=stopping)

        return emit

    def _stop_readers(self) -> None:
        for name, reader in self.readers.items():
            if not reader.stop(READER_STOP_TIMEOUT_S):
                log.warning("capture %s: camera %s did not stop in time", self.name, name)

    def stop(self) -> None:
        self._stopping.set()
        self._stop_requested.set()
