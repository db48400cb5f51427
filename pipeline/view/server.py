"""The view's server: one SUB socket on a pipeline's PUB endpoint, relayed to browser pages.

aiohttp serves the page and a WebSocket on the same asyncio loop as a zmq.asyncio SUB socket.
Each valid message (pipeline.wire.decode) goes to every open page as one binary WebSocket
message, the multipart message packed as [u32 n][u32 length] * n + the n parts (little
endian), without face embeddings (the page draws no biometric vector). The socket subscribes
to `meta` always, keeping its last value for each new page, and to the view's topics only
while a page is open: a publisher sends preview/ frames only while someone watches.

Bounded everywhere a peer reaches: pages (MAX_PAGES), each page's backlog (PAGE_BACKLOG,
oldest dropped and counted), message part size (MAX_PART_BYTES) and the socket's receive
queue (RCVHWM). A loopback bind answers only to loopback Host names and every request's
Origin must be the page's own, so another web site open in the browser cannot read the
stream (cross-site WebSocket hijacking, DNS rebinding).
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
from aiohttp import WSMsgType, web

from pipeline import security, wire
from pipeline.errors import NpucamError

log = logging.getLogger(__name__)

MAX_PAGES = 8
PAGE_BACKLOG = 64  # messages waiting for one slow page; the oldest go first
MAX_PART_BYTES = 64 << 20  # one part of a ZeroMQ message (a 4K preview JPEG is ~2 MB)
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


class Page:
    """One open page: its WebSocket and a bounded backlog, sent by its own task."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.backlog: deque[bytes | str] = deque(maxlen=PAGE_BACKLOG)
        self.dropped = 0
        self._ready = asyncio.Event()

    def offer(self, data: bytes | str) -> None:
        if len(self.backlog) == self.backlog.maxlen:
            self.dropped += 1
        self.backlog.append(data)
        self._ready.set()

    async def send_all(self) -> None:
        """Send the backlog as it fills, until the page goes (a reset ends it quietly)."""
        with contextlib.suppress(ConnectionResetError):
            while not self.ws.closed:
                await self._ready.wait()
                self._ready.clear()
                while self.backlog and not self.ws.closed:
                    data = self.backlog.popleft()
                    if isinstance(data, str):
                        await self.ws.send_str(data)
                    else:
                        await self.ws.send_bytes(data)


class ViewServer:
    """SUB on `endpoint` (CURVE with `curve`), serving the page on host:port."""

    def __init__(
        self,
        endpoint: str,
        topics: Sequence[str] = ("",),
        curve: security.Curve | None = None,
        host: str = "127.0.0.1",
        port: int = 8560,
    ) -> None:
        self.endpoint = endpoint
        self.topics = [t.encode() for t in dict.fromkeys(topics)]
        self.curve = curve
        self.host, self.port = host, port
        self.pages: set[Page] = set()
        self.meta: bytes | None = None
        self.received = 0
        self.malformed = 0
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
        self._runner = web.AppRunner(app, access_log=None)
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
        for page in list(self.pages):
            await page.ws.close()
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

    @web.middleware
    async def _same_origin(self, request: web.Request, handler):
        host = request.host
        if is_loopback_host(self.host) and host_name(host) not in LOOPBACK_NAMES:
            raise web.HTTPForbidden(text=f"view: Host {host!r} is not this machine's")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"http://{host}":
            raise web.HTTPForbidden(text=f"view: Origin {origin!r} is not this page's")
        return await handler(request)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if len(self.pages) >= MAX_PAGES:
            raise web.HTTPServiceUnavailable(text=f"view: {MAX_PAGES} pages are open already")
        ws = web.WebSocketResponse(max_msg_size=PAGE_MESSAGE_BYTES, compress=False)
        await ws.prepare(request)
        page = Page(ws)
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

    async def _relay(self) -> None:
        while True:
            parts = await self._sock.recv_multipart()
            self.received += 1
            self.last_message = time.monotonic()
            try:
                msg = wire.decode(parts)
            except wire.WireError as exc:
                self.malformed += 1
                if self.malformed <= MALFORMED_LOGGED:
                    log.warning("view: skipped malformed message: %s", exc)
                continue
            packed = pack(for_page(msg, parts))
            if msg.topic == "meta":
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
