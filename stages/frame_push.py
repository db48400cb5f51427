"""The `zmq_push` stage: frames PUSHed (stages.frame_wire format) to a `zmq:` camera in another
process, with flow control that drops at the source and keeps the link busy. Measured against
a bare pyzmq PUSH/PULL by bench/frame_transport.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Literal

import zmq
from pydantic import Field, model_validator

from pipeline import security
from pipeline.config import Config, SecuritySection
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.messages import Frame, now_ns
from pipeline.queues import BoundedQueue, QueueClosed, ThreadInbox
from stages.frame_wire import encode_frame
from stages.publish import PublishError, term_context

log = logging.getLogger(__name__)
NOBLOCK = int(zmq.NOBLOCK)
POLLOUT = int(zmq.POLLOUT)
HOLD_POLL_MS = 50  # while frames wait for the peer: how often the inbox is looked at
JPEG_SNDBUF = 64 << 10  # the default SO_SNDBUF of a JPEG link (FramePushOptions.sndbuf)


class FramePushOptions(StageOptions):
    connect: str | None = None
    bind: str | None = None
    format: Literal["jpeg", "raw"] = "jpeg"
    quality: int = Field(90, ge=1, le=100)
    # Frames libzmq may hold for the peer before the sender drops at the source (peer_slow).
    sndhwm: int = Field(2, ge=1)
    # The kernel's send buffer (SO_SNDBUF, doubled by Linux), bytes; 0 keeps the OS default
    # (autotuned, what raw frames need for throughput). What it holds ages when the receiver
    # is behind, so unset it is 0 for raw frames and JPEG_SNDBUF for JPEG (docs/benchmarks.md,
    # frame_transport: 1080p JPEG offered at 200 fps waits 39 ms p50 instead of 178 ms).
    sndbuf: int | None = Field(None, ge=0)
    linger_ms: int = Field(500, ge=0)
    security: SecuritySection | None = None  # this socket's overrides of [security]

    @model_validator(mode="after")
    def _one_endpoint(self):
        if (self.connect is None) == (self.bind is None):
            raise ValueError("give exactly one of `connect` or `bind` (a ZeroMQ endpoint)")
        return self


class FramePush(Stage[FramePushOptions]):
    """Frames -> ZeroMQ PUSH, for a `zmq:` camera elsewhere.

    Flow control drops at the source. Before a frame is encoded the socket is asked whether
    the peer can take a message (ZMQ_EVENTS POLLOUT: fewer than sndhwm frames waiting in
    libzmq). While it cannot (not connected, or not keeping up), the newest frame of each
    camera waits in this stage and the one it replaces is dropped, counted `peer_slow`,
    without being encoded; the waiting frames go out, oldest camera first, the moment the peer
    can take one, so the link never idles while a frame is there to send. With sndhwm 2 here
    and RCVHWM 1 at the `zmq:` camera, what waits between the processes is those frames plus
    what the kernels' TCP buffers hold (docs/benchmarks.md, frame_transport), so a slow
    receiver costs frames, not lag. Raw frames leave from the image's own memory
    (copy=False): pyzmq holds a reference to the buffer until libzmq has written it (no
    MessageTracker: npucam never writes into a captured image, every source allocates a new
    one per frame).

    All of this runs on a sender thread of the stage's own, which takes frames from its
    ThreadInbox and waits for the peer inside libzmq (without the GIL): a frame from a
    capture thread reaches the socket without a wake-up of the event loop each, which at a
    raw link's rate (1,000+ frames/s at 720p) is CPU the two-core host's link needs
    (docs/benchmarks.md, frame_transport).
    """

    kind = "zmq_push"
    accepts = (Frame,)
    Options = FramePushOptions
    inbox_thread = True  # frames from capture threads reach the sender thread directly

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.endpoint: str | None = None
        self.bound = asyncio.Event()
        self.guard: security.SocketSecurity | None = None

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        binds = config.stages[index].options.get("bind") is not None
        return security.check_stage(cls, config, index, bind=binds)

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        if not isinstance(inbox, ThreadInbox):
            raise TypeError(f"zmq_push {self.name}: its inbox must be a ThreadInbox")
        curve = security.stage_curve(self, bind=self.options.bind is not None)
        ctx = zmq.Context()
        self.guard = guard = security.SocketSecurity(ctx, curve, f"zmq_push {self.name}")
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, self.options.sndhwm)
        sock.setsockopt(zmq.LINGER, self.options.linger_ms)
        sndbuf = self.options.sndbuf
        if sndbuf is None:
            sndbuf = JPEG_SNDBUF if self.options.format == "jpeg" else 0
        if sndbuf:
            sock.setsockopt(zmq.SNDBUF, sndbuf)
        try:
            if self.options.bind:
                guard.bind(sock, self.options.bind)
            else:
                guard.connect(sock, self.options.connect)
        except zmq.ZMQError as exc:
            sock.close(0)
            guard.close()
            ctx.term()
            where = self.options.bind or self.options.connect
            raise PublishError(f"zmq_push {self.name}: cannot use {where}: {exc}") from None
        self.endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode() or self.options.connect
        self.bound.set()
        log.info(
            "zmq_push %s: %s %s (%s%s)",
            self.name,
            "bound" if self.options.bind else "connected to",
            self.endpoint,
            self.options.format,
            ", CURVE" if curve else "",
        )
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        stopping = threading.Event()

        def sender() -> None:
            try:
                self._send_all(inbox, sock, stopping)
            except BaseException as exc:  # the stage dies with it, as a run() that raises
                loop.call_soon_threadsafe(_settle, done, exc)
            else:
                loop.call_soon_threadsafe(_settle, done, None)

        thread = threading.Thread(target=sender, name=f"zmq_push {self.name}", daemon=True)
        thread.start()
        try:
            await done
        finally:
            stopping.set()  # cancelled: the thread ends within HOLD_POLL_MS
            await asyncio.to_thread(thread.join)
            sock.close(self.options.linger_ms)
            await asyncio.to_thread(term_context, ctx, guard)

    def _send_all(self, inbox: ThreadInbox, sock: zmq.Socket, stopping: threading.Event) -> None:  # noqa: C901
        """The sender thread: each frame the peer can take now is encoded and sent; while it
        cannot, the newest frame per camera waits (class docstring), the thread blocked in
        libzmq's poll for room, not holding the GIL. When the inbox ends, what still waits
        gets linger_ms for the peer, then is dropped."""
        fmt, quality = self.options.format, self.options.quality
        held: dict[str, Frame] = {}  # insertion order: the camera that waits longest first

        def send(frame: Frame) -> None:
            start = time.perf_counter()
            try:
                sock.send_multipart(encode_frame(frame, fmt, quality), NOBLOCK, copy=False)
            except zmq.Again:
                self.metrics.drop(self.name, frame.camera, "peer_slow")
            except Exception:
                self.item_failed(frame)
            else:
                self.metrics.did(self.name, frame.camera, time.perf_counter() - start)

        def writable(timeout_ms: int = 0) -> bool:
            """Whether the peer can take a frame now, or within timeout_ms (waiting in C)."""
            if not timeout_ms:
                return bool(sock.getsockopt(zmq.EVENTS) & POLLOUT)
            return bool(sock.poll(timeout_ms, POLLOUT))

        try:
            while not stopping.is_set():
                if not held:
                    try:
                        frame = inbox.get_wait(HOLD_POLL_MS / 1000)
                    except QueueClosed:
                        return
                    if frame is None:
                        continue
                    if writable():
                        send(frame)
                        continue
                    held[frame.camera] = frame
                while (newer := inbox.get_nowait()) is not None:
                    if (old := held.get(newer.camera)) is not None:
                        self.metrics.drop(self.name, old.camera, "peer_slow")
                    held[newer.camera] = newer
                if writable():
                    frame = held.pop(next(iter(held)))
                    if inbox.drop_stale and now_ns() > frame.deadline_ns:
                        self.metrics.drop(self.name, frame.camera, "stale")  # waited too long
                    else:
                        send(frame)
                    continue
                if inbox.closed:  # nothing more comes: the peer has linger_ms to take these
                    if not writable(self.options.linger_ms):
                        return
                    continue
                writable(HOLD_POLL_MS)
        finally:
            for frame in held.values():  # the peer took none in linger_ms, or stopped
                self.metrics.drop(self.name, frame.camera, "peer_slow")


def _settle(done: asyncio.Future, exc: BaseException | None) -> None:
    if not done.done():
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)
