"""The view's server: one SUB socket on a pipeline's PUB endpoint, relayed to browser pages.

aiohttp serves the page and a WebSocket on the same asyncio loop as a zmq.asyncio SUB socket.
Each valid message (pipeline.wire.decode) goes to every open page as one binary WebSocket
message, the multipart message packed as [u32 n][u32 length] * n + the n parts (little
endian), without face embeddings (the page draws no biometric vector). The socket subscribes
to `meta` always, keeping its last value for each new page, and to the view's topics only
while a page is open: a publisher sends preview/ frames only while someone watches.

Bounded everywhere a peer reaches: pages (MAX_PAGES; a new page replaces the one that has
gone longest without taking a message), each page's backlog (PAGE_BACKLOG messages and
PAGE_BACKLOG_BYTES, oldest dropped and counted), each message (MAX_MESSAGE_BYTES over all its
parts, read part by part and let go once over; `meta` kept only within MAX_META_BYTES) and the
socket's receive queue (RCVHWM). Every request's Host must be a loopback name, an IP address
(what a browser sends when the address was typed), the bind's own name or one named with
`--allow-host`, and its Origin must be the page's own, so another web site open in the
browser cannot read the stream (cross-site WebSocket hijacking, DNS rebinding), whatever the
bind. close() ends within CLOSE_TIMEOUT_S however the pages behave (a page that does not read
is dropped: waiting for its close handshake kept the view from exiting on SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import ipaddress
import json
import logging
import struct
import time
from collections import deque
from collections.abc import Sequence

import zmq
import zmq.asyncio
from aiohttp import WSCloseCode, WSMsgType, web

from pipeline import security, wire
from pipeline.errors import NpucamError

log = logging.getLogger(__name__)

MAX_PAGES = 8
PAGE_BACKLOG = 64  # messages waiting for one slow page; the oldest go first
PAGE_BACKLOG_BYTES = 128 << 20  # and their bytes
MAX_PART_BYTES = 64 << 20  # one part of a ZeroMQ message (a 4K preview JPEG is ~2 MB)
MAX_MESSAGE_BYTES = 64 << 20  # all parts of one message
MAX_META_BYTES = 1 << 20  # a `meta` message kept for new pages (a run's is a few KiB)
CLOSE_TIMEOUT_S = 0.5  # close(): pages get half of it to take their close frame
RCVHWM = 1000
STATUS_INTERVAL_S = 1.0
PAGE_MESSAGE_BYTES = 1024  # pages send nothing; anything larger closes the socket
MALFORMED_LOGGED = 5
STATIC = importlib.resources.files(__package__) / "static"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class ViewError(NpucamError):
    """A view that cannot start: a bad --bind, an address in use, an endpoint it cannot use."""


def pack(parts: Sequence[bytes]) -> bytes:
    """[topic, header, *parts] -> u32 count, u32 length of each, then the parts (little end)."""
    head = struct.pack(f"<{len(parts) + 1}I", len(parts), *(len(p) for p in parts))
    return b"".join([head, *parts])


def for_page(msg: wire.Message, parts: Sequence[bytes]) -> list[bytes]:
    """The message as a page receives it: a face's embedding part and descriptor removed."""
    descs = msg.header.get("parts", [])
    keep = [i for i, d in enumerate(descs) if d["name"] != "embedding"]
    if len(keep) == len(descs):
        return [bytes(p) for p in parts]
    header = {**msg.header, "parts": [descs[i] for i in keep]}
    raw = json.dumps(header, separators=(",", ":")).encode()
    return [bytes(parts[0]), raw, *(bytes(parts[2 + i]) for i in keep)]


def parse_bind(bind: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:PORT for IPv6) -> (host, port); ViewError names what is wrong."""
    host, sep, port = bind.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ViewError(f"view: --bind {bind!r}: expected HOST:PORT, e.g. 127.0.0.1:8560")
    return host, int(port)


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port: "[::1]:80" -> "[::1]"."""
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.partition(":")[0]


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return False
    return True


class Page:
    """One open page: its WebSocket and a backlog bounded in messages and bytes, sent by its
    own task. active: monotonic time it opened or last took a message."""

    def __init__(
        self, ws: web.WebSocketResponse, transport: asyncio.BaseTransport | None = None
    ) -> None:
        self.ws = ws
        self.transport = transport
        self.backlog: deque[bytes | str] = deque()
        self.backlog_bytes = 0
        self.dropped = 0
        self.active = time.monotonic()
        self._ready = asyncio.Event()

    def offer(self, data: bytes | str) -> None:
        self.backlog.append(data)
        self.backlog_bytes += len(data)
        while len(self.backlog) > PAGE_BACKLOG or self.backlog_bytes > PAGE_BACKLOG_BYTES:
            self.backlog_bytes -= len(self.backlog.popleft())
            self.dropped += 1
        self._ready.set()

    async def send_all(self) -> None:
        """Send the backlog as it fills, until the page goes (a reset ends it quietly)."""
        with contextlib.suppress(ConnectionResetError):
            while not self.ws.closed:
                await self._ready.wait()
                self._ready.clear()
                while self.backlog and not self.ws.closed:
                    data = self.backlog.popleft()
                    self.backlog_bytes -= len(data)
                    if isinstance(data, str):
                        await self.ws.send_str(data)
                    else:
                        await self.ws.send_bytes(data)
                    self.active = time.monotonic()

    async def shut(self, message: str, timeout: float) -> None:
        """Close with a close frame if the page takes it within timeout, else drop the
        connection (a page that does not read never takes it)."""
        with contextlib.suppress(TimeoutError, ConnectionError, asyncio.CancelledError):
            await asyncio.wait_for(
                self.ws.close(code=WSCloseCode.GOING_AWAY, message=message.encode()), timeout
            )
        if self.transport is not None:
            self.transport.abort()  # close() waits to flush what a stuck page never reads


class ViewServer:
    """SUB on `endpoint` (CURVE with `curve`), serving the page on host:port."""

    def __init__(
        self,
        endpoint: str,
        topics: Sequence[str] = ("",),
        curve: security.Curve | None = None,
        host: str = "127.0.0.1",
        port: int = 8560,
        allow_hosts: Sequence[str] = (),
    ) -> None:
        self.endpoint = endpoint
        self.topics = [t.encode() for t in dict.fromkeys(topics)]
        self.curve = curve
        self.host, self.port = host, port
        named = [] if is_ip_address(host) or host in ("", "0.0.0.0", "::") else [host]
        self.allow_hosts = {h.lower() for h in (*allow_hosts, *named)}
        self.pages: set[Page] = set()
        self.meta: bytes | None = None
        self.received = 0
        self.malformed = 0
        self.oversized = 0  # messages over MAX_MESSAGE_BYTES, or meta over MAX_META_BYTES
        self.replaced = 0  # pages closed to make room for a new one
        self.resets = 0  # connections a page reset while the view answered
        self.last_message = 0.0
        self.url = ""
        self._ctx: zmq.asyncio.Context | None = None
        self._guard: security.SocketSecurity | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._guard = security.SocketSecurity(self._ctx, self.curve, "view")
        sock = self._sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_PART_BYTES)
        sock.setsockopt(zmq.SUBSCRIBE, b"meta")
        try:
            self._guard.connect(sock, self.endpoint)
        except zmq.ZMQError as exc:
            self._close_socket()
            raise ViewError(f"view: cannot connect to {self.endpoint}: {exc}") from None
        app = web.Application(middlewares=[self._same_origin])
        app.router.add_get("/", self._index)
        app.router.add_get("/ws", self._websocket)
        app.router.add_static("/static/", STATIC)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=CLOSE_TIMEOUT_S / 2)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as exc:
            await self.close()
            raise ViewError(f"view: cannot serve on {self.host}:{self.port}: {exc}") from None
        self.port = self._runner.addresses[0][1]
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{name}:{self.port}/"
        if not is_loopback_host(self.host):
            log.warning(
                "view: serves frames, boxes and identities on %s over plain HTTP without "
                "authentication, to anyone who can reach it (docs/security.md)",
                self.url,
            )
        self._tasks = [
            asyncio.create_task(self._relay()),
            asyncio.create_task(self._status_every(STATUS_INTERVAL_S)),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(
            *(p.shut("view: closing", CLOSE_TIMEOUT_S / 2) for p in list(self.pages))
        )
        if self._runner is not None:
            await self._runner.cleanup()
        self._close_socket()

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
        if self._guard is not None:
            self._guard.close()
        if self._ctx is not None:
            self._ctx.term()
        self._sock = self._guard = self._ctx = None

    def host_allowed(self, name: str) -> bool:
        """A Host name a page may use: loopback names, names given to --allow-host (and a
        named bind), and on a bind beyond loopback any IP address: a rebound name is refused."""
        name = name.lower()
        if name in LOOPBACK_NAMES or name in self.allow_hosts:
            return True
        return not is_loopback_host(self.host) and is_ip_address(name)

    @web.middleware
    async def _same_origin(self, request: web.Request, handler):
        host = request.host
        if not self.host_allowed(host_name(host)):
            raise web.HTTPForbidden(
                text=f"view: Host {host!r} is not this machine's (name it with --allow-host)"
            )
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"http://{host}":
            raise web.HTTPForbidden(text=f"view: Origin {origin!r} is not this page's")
        try:
            return await handler(request)
        except ConnectionResetError:
            # a page gone mid-answer: one line, not aiohttp's traceback of the failed write
            self.resets += 1
            log.info("view: %s reset the connection (%s)", request.remote, request.path)
            return web.Response(status=499)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if len(self.pages) >= MAX_PAGES:
            idle = min(self.pages, key=lambda p: p.active)
            self.pages.discard(idle)
            self.replaced += 1
            log.warning("view: %d pages open: closing the one idle longest", MAX_PAGES)
            self._spawn(idle.shut("view: replaced by a newer page", CLOSE_TIMEOUT_S / 2))
        ws = web.WebSocketResponse(max_msg_size=PAGE_MESSAGE_BYTES, compress=False)
        await ws.prepare(request)
        page = Page(ws, request.transport)
        if self.meta is not None:
            page.offer(self.meta)
        page.offer(self._status(page))
        self.pages.add(page)
        if len(self.pages) == 1:
            for topic in self.topics:
                self._sock.setsockopt(zmq.SUBSCRIBE, topic)
        sender = asyncio.create_task(page.send_all())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.ERROR:
                    break  # pages send nothing; what they send is ignored
        finally:
            sender.cancel()
            self.pages.discard(page)
            if not self.pages and self._sock is not None:
                for topic in self.topics:
                    self._sock.setsockopt(zmq.UNSUBSCRIBE, topic)
        return ws

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))

    async def _receive(self) -> list[bytes] | None:
        """One message's parts, or None if they add up to more than MAX_MESSAGE_BYTES: then
        each part is let go as it is read and none is kept."""
        parts: list[bytes] = []
        size = 0
        while True:
            frame = await self._sock.recv(copy=False)
            size += len(frame)
            if size <= MAX_MESSAGE_BYTES:
                parts.append(frame.bytes)
            elif parts:
                parts = []
            if not frame.more:
                return parts if size <= MAX_MESSAGE_BYTES else None

    def _oversized(self, what: str) -> None:
        self.oversized += 1
        if self.oversized <= MALFORMED_LOGGED:
            log.warning("view: skipped %s", what)

    async def _relay(self) -> None:
        while True:
            parts = await self._receive()
            self.received += 1
            self.last_message = time.monotonic()
            if parts is None:
                self._oversized(f"a message over {MAX_MESSAGE_BYTES} bytes")
                continue
            try:
                msg = wire.decode(parts)
            except wire.WireError as exc:
                self.malformed += 1
                if self.malformed <= MALFORMED_LOGGED:
                    log.warning("view: skipped malformed message: %s", exc)
                continue
            packed = pack(for_page(msg, parts))
            if msg.topic == "meta":
                if len(packed) > MAX_META_BYTES:
                    self._oversized(f"a meta message of {len(packed)} bytes (not kept)")
                    continue
                self.meta = packed
            for page in self.pages:
                page.offer(packed)

    def _status(self, page: Page) -> str:
        age = None if not self.last_message else round(time.monotonic() - self.last_message, 1)
        return json.dumps(
            {
                "view": {
                    "endpoint": self.endpoint,
                    "received": self.received,
                    "malformed": self.malformed,
                    "oversized": self.oversized,
                    "replaced": self.replaced,
                    "dropped": page.dropped,
                    "pages": len(self.pages),
                    "last_message_age_s": age,
                }
            }
        )

    async def _status_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            for page in self.pages:
                page.offer(self._status(page))


async def serve(server: ViewServer, stop: asyncio.Event) -> None:
    """Run server until stop is set."""
    await server.start()
    try:
        print(f"npucam view: {server.url} (relaying {server.endpoint}; Ctrl-C stops)", flush=True)
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await server.close()
