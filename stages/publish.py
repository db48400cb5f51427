"""The publish stage: results out on a ZeroMQ PUB socket (docs/protocol.md). Frames PUSHed
to a remote process are stages/frame_push.py.

Publish never blocks the pipeline: every send is NOBLOCK on a socket with a bounded SNDHWM,
so a slow subscriber costs messages, never latency. PUB drops past the high-water mark
silently (ZeroMQ gives no signal; zeromq/libzmq#4394).

XPUB, unlike PUB, hands every subscribe/unsubscribe to the application, and libzmq holds
them in an unbounded queue until read: publish reads them while it waits for subscribers and
then drains them after every send and every SUBSCRIPTION_DRAIN_S for as long as it runs, so
subscribers that come and go cost no memory. Reading them is also where the subscription
limits are enforced (stages/subscriptions.py: a peer over max_subscription_bytes,
max_subscriptions_per_peer or max_subscriptions is disconnected), where subscriptions that
match `meta` get the meta message (a last-value cache: every new subscriber receives it,
stages.meta) and where those matching `preview/<camera>` turn that camera's preview on
(stages.preview), and those matching `mesh/<rig>` the body stage's mesh
(stages/body/mesh_topic.py). Without `[security]` any process that reaches the port can subscribe
(docs/security.md).

With `[security]` (or a stage's `security` table) both sockets run CURVE through
pipeline.security: a binding socket admits only the allow-listed client keys, a connecting
one only talks to the pinned server key (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

import cv2
import zmq
import zmq.asyncio
from pydantic import Field

from pipeline import security, wire
from pipeline.config import Config, SecuritySection
from pipeline.errors import NpucamError
from pipeline.graph import Context, Outbox, Stage, StageOptions
from pipeline.messages import Detections, Frame, Result, now_ns
from pipeline.queues import BoundedQueue, camera_of
from stages import meta, preview
from stages.body.mesh_topic import MeshTap
from stages.body.mesh_topic import run_taps as mesh_taps
from stages.subscriptions import SubscriptionGuard, SubscriptionLimits

log = logging.getLogger(__name__)
NOBLOCK = int(zmq.NOBLOCK)
POLLIN = int(zmq.POLLIN)
SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
raw_send = zmq.backend.Socket.send
SUBSCRIPTION_DRAIN_S = 0.1
SUBSCRIPTION_CHECK_S = 0.001


class Taps:
    """What publish stage `name` of a run hands every message it sent (its parts, as sent),
    after the send: how a record stage logs them (stages/record/stage.py). `done` is set once
    the stage has sent its last message (the final stats)."""

    def __init__(self) -> None:
        self.callables: list[Callable[[list], None]] = []
        self.done = threading.Event()

    def __call__(self, parts: list) -> None:
        for tap in self.callables:
            tap(parts)


def taps(context: Context, name: str) -> Taps:
    """The Taps of publish stage `name` of this run (made on first use, by either side)."""
    return context.shared(f"publish-taps/{name}", Taps)


class PublishError(NpucamError):
    """A publish socket that cannot be set up (address in use, bad endpoint)."""


class PublishOptions(StageOptions):
    bind: str = Field("tcp://127.0.0.1:5560", min_length=1)
    sndhwm: int = Field(1000, ge=1)
    linger_ms: int = Field(1000, ge=0)
    frame_meta: bool = True  # a Frame that reaches publish goes out as det/<camera>, no boxes
    preview: bool = False  # JPEGs on preview/<camera> while a subscriber wants them
    preview_fps: float = Field(5.0, gt=0)  # at most this many per camera a second
    preview_quality: int = Field(80, ge=1, le=100)
    preview_max_width: int = Field(640, ge=16)
    stats: bool = True  # the `stats` topic every [metrics] stats_interval_s
    # Hold publishing until this many subscriptions have arrived (offline runs, tests): the
    # inbox backs up meanwhile, by its policy. 0 publishes from the start.
    wait_for_subscribers: int = Field(0, ge=0)
    security: SecuritySection | None = None  # this socket's overrides of [security]
    # A peer that sends a longer subscription, holds more, or takes all peers' subscriptions
    # over max_subscriptions is disconnected (stages/subscriptions.py).
    max_subscription_bytes: int = Field(64, ge=1, le=1 << 20)
    max_subscriptions_per_peer: int = Field(64, ge=1)
    max_subscriptions: int = Field(512, ge=1)


# The longest topic prefix before a camera name: "preview/".
TOPIC_PREFIX_BYTES = len("preview/")


class Publish(Stage[PublishOptions]):
    """Results -> ZeroMQ PUB, topics `<kind>/<camera>` and `stats`."""

    kind = "publish"
    accepts = (Result, Frame, preview.PreviewFrame)
    Options = PublishOptions

    def __init__(self, name, options, context) -> None:
        super().__init__(name, options, context)
        self.endpoint: str | None = None
        self.bound = asyncio.Event()
        self.guard: security.SocketSecurity | None = None
        self._stats_seq = 0
        self.subscription_messages = 0  # subscribe/unsubscribe notifications read from XPUB
        self.tap: preview.PreviewTap | None = None
        if options.preview:
            cameras = [c.name for c in context.config.cameras]
            self.tap = preview.run_taps(context)[name] = preview.PreviewTap(
                options.preview_fps, cameras
            )
        rigs = [s.options.get("rig") for s in context.config.stages if s.kind == "body"]
        self.mesh_tap: MeshTap | None = None
        if rigs:
            self.mesh_tap = mesh_taps(context)[name] = MeshTap([str(r) for r in rigs])
        self._meta: list | None = None
        self._meta_due = False  # a subscription matching `meta` arrived since the last send
        self._plain: zmq.Socket | None = None
        self.subscriptions: SubscriptionGuard | None = None
        self.taps = taps(context, name)

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        problems = security.check_stage(cls, config, index, bind=True)
        limit = config.stages[index].options.get("max_subscription_bytes", 64)
        for i, cam in enumerate(config.cameras if type(limit) is int else []):
            if TOPIC_PREFIX_BYTES + len(cam.name.encode()) > limit:
                problems.append(
                    f"cameras[{i}].name: topic preview/{cam.name} is longer than "
                    f"stages[{index}].max_subscription_bytes ({limit}): no subscriber could "
                    "subscribe to it"
                )
        return problems

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:  # noqa: C901
        curve = security.stage_curve(self, bind=True)
        ctx = zmq.asyncio.Context()
        self.guard = guard = security.SocketSecurity(ctx, curve, f"publish {self.name}")
        limits = SubscriptionLimits(
            self.options.max_subscription_bytes,
            self.options.max_subscriptions_per_peer,
            self.options.max_subscriptions,
        )
        self.subscriptions = subscriptions = SubscriptionGuard(limits, self.name)
        # XPUB sends exactly as PUB does and also reports subscriptions (wait_for_subscribers).
        sock = ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.SNDHWM, self.options.sndhwm)
        sock.setsockopt(zmq.LINGER, self.options.linger_ms)
        subscriptions.configure(sock)
        try:
            guard.bind(sock, self.options.bind)
        except zmq.ZMQError as exc:
            sock.close(0)
            guard.close()
            ctx.term()
            raise PublishError(
                f"publish {self.name}: cannot bind {self.options.bind}: {exc}"
            ) from None
        self.endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        # A NOBLOCK send or recv never waits, so it goes through a plain (synchronous) view of
        # the socket: no Future per message.
        self._plain = plain = zmq.Socket.shadow(sock.underlying)
        monitor_at = f"inproc://npucam-publish-{id(self):x}-monitor"
        sock.monitor(monitor_at, zmq.EVENT_DISCONNECTED)
        monitor = ctx.socket(zmq.PAIR)
        monitor.connect(monitor_at)
        subscriptions.attach(plain, zmq.Socket.shadow(monitor.underlying), self.endpoint)
        self.metrics.add_gauges(self.name, subscriptions.gauges)
        self.bound.set()
        log.info("publish %s: bound %s%s", self.name, self.endpoint, " (CURVE)" if curve else "")

        def send(parts: list) -> None:
            # send_multipart(parts, NOBLOCK) with int flags: pyzmq's combines enum flags for
            # every part. Only the first part can raise zmq.Again (libzmq takes the rest).
            # The backend's send is the one zmq.Socket.send ends in, without its Python
            # wrapper (which only adds RADIO/SERVER routing arguments).
            for part in parts[:-1]:
                raw_send(plain, part, SNDMORE_NOBLOCK)
            raw_send(plain, parts[-1], NOBLOCK)
            self.taps(parts)

        self._meta = self._meta_message()
        self._warn_if_no_previews()
        interval = self.context.config.metrics.stats_interval_s
        tasks: list[asyncio.Task] = []
        if self.options.stats and interval > 0:
            tasks.append(asyncio.create_task(self._publish_stats_every(sock, interval)))
        try:
            await self._await_subscribers(sock, inbox)
            tasks.append(asyncio.create_task(self._drain_subscriptions()))
            check_at = 0.0
            async for item in inbox:
                start = time.perf_counter()
                try:
                    if isinstance(item, Result):
                        send(wire.encode_result(item, now_ns()))
                    elif isinstance(item, preview.PreviewFrame):
                        if self.tap is not None and self.tap.wanted(item.camera):
                            send(await self._preview_message(item))
                    else:
                        for parts in await self._frame_messages(item):
                            send(parts)
                except zmq.Again:
                    self.metrics.drop(self.name, camera_of(item), "queue_full")
                except Exception:
                    self.item_failed(item)
                else:
                    self.metrics.did(self.name, camera_of(item), time.perf_counter() - start)
                # A send lets libzmq take in subscriptions; they are read (and the limits
                # checked) within SUBSCRIPTION_CHECK_S of it: ZMQ_EVENTS costs a syscall.
                if start >= check_at:
                    check_at = start + SUBSCRIPTION_CHECK_S
                    if plain.getsockopt(zmq.EVENTS) & POLLIN:
                        self._read_subscriptions()
        finally:
            for task in tasks:
                task.cancel()
            if self.options.stats:
                await self._send_stats(sock)  # the final numbers, after the drain
            self.taps.done.set()
            sock.disable_monitor()
            subscriptions.close()
            monitor.close(0)
            sock.close(self.options.linger_ms)
            await asyncio.to_thread(term_context, ctx, guard)

    async def _await_subscribers(self, sock, inbox: BoundedQueue) -> None:
        wanted = self.options.wait_for_subscribers
        seen = 0
        while seen < wanted and not inbox.closed:
            if await sock.poll(100, zmq.POLLIN):  # 100 ms: notice the pipeline stopping
                read, subscribed = self._read_subscriptions()
                seen += subscribed
        if wanted:
            log.info("publish %s: %d subscriber(s) joined", self.name, seen)

    async def _drain_subscriptions(self) -> None:
        """Read XPUB's subscription notifications every SUBSCRIPTION_DRAIN_S (besides after
        every send), enforcing the subscription limits (a timer, not the socket's fd: the
        synchronous sends share that fd's edge-triggered wakeups, which an fd watch here could
        miss)."""
        while True:
            await asyncio.sleep(SUBSCRIPTION_DRAIN_S)
            self._read_subscriptions()

    def _read_subscriptions(self) -> tuple[int, int]:
        """Drain XPUB's notifications under the subscription limits, feed each to the meta
        and preview bookkeeping, then send the meta message if one was asked for: (read,
        subscriptions among them)."""
        read, subscribed = self.subscriptions.drain(self._subscription)
        self.subscription_messages += read
        self._send_meta()
        return read, subscribed

    def _subscription(self, event: bytes) -> None:
        """One XPUB notification (byte 1 subscribe / 0 unsubscribe, then the prefix)."""
        subscribe, prefix = event[:1] == b"\x01", event[1:]
        if self.tap is not None:
            self.tap.subscription(subscribe, prefix)
        if self.mesh_tap is not None:
            self.mesh_tap.subscription(subscribe, prefix)
        self._meta_due |= subscribe and b"meta".startswith(prefix)

    def _send_meta(self) -> None:
        """The meta message, once for every subscription to it read since the last call: a
        subscriber that subscribes in a loop costs everyone at most one meta a drain period."""
        if self._meta_due and self._meta is not None:
            self._meta_due = False
            with contextlib.suppress(zmq.Again):
                self._plain.send_multipart(self._meta, NOBLOCK)
                self.taps(self._meta)

    def _meta_message(self) -> list:
        ts = now_ns()
        header = {
            "kind": "meta",
            "camera": "",
            "seq": 0,
            "capture_ts": ts,
            "publish_ts": ts,
            "backend": "none",
            "model": "none",
            "synthetic": False,
            "meta": meta.run_meta(self.context.config),
        }
        return wire.encode("meta", header)

    def _warn_if_no_previews(self) -> None:
        config = self.context.config
        index = config.stage_names.index(self.name)
        if self.tap is not None and not preview.frame_producers(config, index):
            log.warning(
                "publish %s: preview = true, but no stage sends it frames (only a capture "
                "stage or a detect stage can): preview/ stays empty",
                self.name,
            )

    async def _frame_messages(self, item: Frame) -> list[list]:
        messages = []
        if self.options.frame_meta:
            messages.append(wire.encode_result(Detections.without_detector(item), now_ns()))
        if self.tap is not None and self.tap.due(item.camera, item.capture_ts_ns):
            messages.append(await self._preview_message(item))
        return messages

    async def _preview_message(self, item: Frame | preview.PreviewFrame) -> list:
        jpeg, (h, w) = await asyncio.to_thread(self._preview_jpeg, item.image)
        header = {
            "kind": "preview",
            "camera": item.camera,
            "seq": item.seq,
            "capture_ts": item.capture_ts_ns,
            "publish_ts": now_ns(),
            "backend": "none",
            "model": "none",
            "synthetic": False,
            "width": w,
            "height": h,
        }
        return wire.encode(f"preview/{item.camera}", header, [("jpeg", jpeg)], {"jpeg": "jpeg"})

    def _preview_jpeg(self, image):
        """image: uint8 [H, W, 3] BGR -> (JPEG bytes as uint8 [n], (h, w) after downscale)."""
        h, w = image.shape[:2]
        if w > self.options.preview_max_width:
            scale = self.options.preview_max_width / w
            image = cv2.resize(
                image,
                (self.options.preview_max_width, max(1, round(h * scale))),
                interpolation=cv2.INTER_AREA,
            )
        ok, jpeg = cv2.imencode(
            ".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.options.preview_quality]
        )
        if not ok:
            raise PublishError(f"publish {self.name}: JPEG encode failed")
        return jpeg.reshape(-1), image.shape[:2]

    async def _publish_stats_every(self, sock, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self._send_stats(sock)

    async def _send_stats(self, sock) -> None:
        ts = now_ns()
        header = {
            "kind": "stats",
            "camera": "",
            "seq": self._stats_seq,
            "capture_ts": ts,
            "publish_ts": ts,
            "backend": "none",
            "model": "none",
            "synthetic": False,
            "stats": self.metrics.snapshot(),
        }
        self._stats_seq += 1
        parts = wire.encode("stats", header)
        try:
            await sock.send_multipart(parts, flags=zmq.NOBLOCK)
            self.taps(parts)
        except zmq.Again:
            log.debug("publish %s: stats message dropped at the high-water mark", self.name)


def term_context(ctx: zmq.Context, guard: security.SocketSecurity) -> None:
    """Stop the ZAP authenticator (its sockets would keep the context open), then term ctx,
    which waits up to the data socket's linger_ms for queued messages. Peers already
    connected have finished their handshake, so the flush does not need the authenticator."""
    guard.close()
    ctx.term()
