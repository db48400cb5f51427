"""zmq:tcp://HOST:PORT cameras: frames a remote capture process PUSHes (stages/frame_wire.py),
PULLed with their sender's seq and grab time, CURVE-secured with the keys of CameraSpec.curve
(docs/security.md). The source connects, does not bind; every frame it gets belongs to this
camera (a grab time further than max_clock_skew_ms from this host's clock is replaced by the
arrival time and counted in clock_skews, stages/sources.py). ZeroMQ reconnects its TCP link
itself, but not after a protocol error (a message over MAXMSGSIZE, or one that fails CURVE's
authentication, ends that connection for good in libzmq 4.3.5), so a zmq source silent for
stall_timeout_s is reopened like any live source."""

from __future__ import annotations

import re
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import zmq

from pipeline.config import DEFAULT_MAX_PIXELS, DEFAULT_RECEIVE_BUFFER_BYTES
from pipeline.security import Curve, SocketSecurity
from stages.frame_wire import FrameWireError, decode_frame
from stages.source_kinds.base import BadFrame, Source, SourceFailed
from stages.source_kinds.registry import SourceKind

if TYPE_CHECKING:
    from stages.source_kinds.spec import CameraSpec

MAX_WIRE_SEQ = 2**53  # a received seq must stay exact for JSON readers whose numbers are doubles


class ZmqKind(SourceKind):
    """target: the tcp://HOST:PORT endpoint it connects to. Live: probed by the rate frames
    arrive at."""

    name = "zmq"
    schemes = ("zmq",)
    forms = ("zmq:tcp://",)
    live = True
    probe = "live"

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> str:
        m = re.fullmatch(r"tcp://([^\s:/*]+|\[[0-9a-fA-F:.]+\]):(\d{1,5})", rest)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise spec.error("zmq needs a ZeroMQ tcp endpoint: zmq:tcp://HOST:PORT")
        return rest

    def open(self, spec: CameraSpec, stop: threading.Event) -> ZmqSource:
        return ZmqSource(
            spec.target,
            stop,
            spec.curve,
            spec.name,
            spec.stall_timeout_s,
            spec.max_pixels,
            spec.receive_buffer_bytes,
        )


class ZmqSource(Source):
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
            raise SourceFailed(f"cannot connect to {self.endpoint}: {exc}") from None

    def read(self, seq: int) -> tuple[np.ndarray, int, str, int] | None:
        """The next frame (image, capture time, description, the sender's seq); None after
        stop, or after 0.9 * stall_timeout_s without one (the reader's "stalled" mark), with
        the socket already closed: a frame sent once the camera shows "stale" then waits for
        the reopened socket instead of being lost."""
        sock = self.sock
        if sock is None:
            raise SourceFailed(f"{self.description} is not open")
        give_up = time.monotonic() + 0.9 * self.stall_timeout_s
        while not self.stop.is_set():
            left_ms = (give_up - time.monotonic()) * 1000
            if not sock.poll(int(max(0, min(self.POLL_MS, left_ms))), zmq.POLLIN):
                if left_ms <= 0:
                    self.close()
                    return None
                continue
            # copy=False: a raw image is a view of the message's memory (stages.frame_wire).
            parts = sock.recv_multipart(copy=False)
            try:
                remote = decode_frame(parts, self.max_pixels)
            except FrameWireError as exc:
                raise BadFrame("bad_messages", str(exc)) from None
            if remote.seq >= MAX_WIRE_SEQ:
                raise BadFrame("bad_messages", f"frame seq {remote.seq} is not below 2^53")
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


KIND = ZmqKind()
