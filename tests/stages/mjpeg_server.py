"""Controllable test cameras on 127.0.0.1 for capture tests (never reachable off-host).

LoopbackCamera holds what every test camera shares: a listener on a free port, one thread per
client, JPEG test cards at `fps`, and the faults a test injects: stall() (connections stay
open, nothing is sent), down() (every connection and the listener close: new connects are
refused), up() (listen again on the same port), and corrupt_every (every Nth JPEG is garbage).

MjpegServer serves `multipart/x-mixed-replace` over HTTP(S) as IP cameras do, in the form
FFmpeg's mpjpeg demuxer reads: each part is `--BOUNDARY`, `Content-Type: image/jpeg`,
`Content-Length: N`, a blank line, then N bytes of JPEG and CRLF.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator

import cv2
import numpy as np

BOUNDARY = "npucamframe"


def card_image(n: int, width: int = 160, height: int = 120) -> np.ndarray:
    """uint8 [height, width, 3] BGR picture of frame n: a bar that moves with n, and n itself."""
    image = np.full((height, width, 3), 40, np.uint8)
    x = (n * 4) % width
    image[:, x : x + 8] = (0, 200, 255)
    cv2.putText(image, str(n), (8, height // 2), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (255, 255, 255), 2)
    return image


class LoopbackCamera:
    """Listener, client threads, paced JPEG cards and fault injection; subclasses speak a
    protocol in serve(conn)."""

    scheme = ""

    def __init__(self, fps: float = 25.0, width: int = 160, height: int = 120) -> None:
        self.fps = fps
        self.width = width
        self.height = height
        self.port = 0
        self.corrupt_every = 0  # when > 0, every Nth card is sent as garbage instead of JPEG
        self.frames_sent = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._sending = threading.Event()
        self._sending.set()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/video"

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Listen (on a free port the first time, on the same port after down())."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(8)
        listener.settimeout(0.05)
        self.port = listener.getsockname()[1]
        self._closing.clear()
        self._spawn(self._accept_loop, listener)

    @property
    def threads_alive(self) -> int:
        """Server threads still running (0 after close())."""
        return sum(t.is_alive() for t in self._threads)

    def stall(self) -> None:
        """Keep connections open but send nothing (a camera whose encoder hangs)."""
        self._sending.clear()

    def resume(self) -> None:
        self._sending.set()

    def down(self) -> None:
        """Close every connection and the listener: a camera that dropped off the network."""
        self._closing.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = [t for t in self._threads if t.is_alive()]

    def up(self) -> None:
        """Listen again on the same port and send frames."""
        self.resume()
        self.start()

    def close(self) -> None:
        self.resume()
        self.down()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def cards(self) -> Iterator[bytes]:
        """JPEG cards at fps while sending, none while stalled, until down()."""
        next_at = time.monotonic()
        while not self._closing.is_set():
            if not self._sending.wait(0.02):
                next_at = time.monotonic()
                continue
            with self._lock:
                n = self.frames_sent
                self.frames_sent += 1
            ok, jpeg = cv2.imencode(".jpg", card_image(n, self.width, self.height))
            assert ok
            data = jpeg.tobytes()
            if self.corrupt_every and n % self.corrupt_every == self.corrupt_every - 1:
                data = data[:20] + bytes(range(256)) * 4
            yield data
            next_at += 1.0 / self.fps
            delay = next_at - time.monotonic()
            if delay > 0:
                self._closing.wait(delay)

    def read_request(self, conn: socket.socket, buffer: bytearray) -> bytes | None:
        """Next CRLFCRLF-terminated request head from conn (None once the client or the
        server closes); bytes after it stay in buffer."""
        while b"\r\n\r\n" not in buffer:
            if self._closing.is_set():
                return None
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                return None
            buffer += chunk
        head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        buffer[:] = rest
        return head

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self, listener: socket.socket) -> None:
        try:
            while not self._closing.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with self._lock:
                    self.connections += 1
                self._spawn(self._client, conn)
        finally:
            listener.close()

    def _client(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(0.5)
            self.serve(conn)
        except OSError:
            pass  # the client went away
        finally:
            conn.close()


class MjpegServer(LoopbackCamera):
    """Serves JPEG test cards at `fps` to every client of http(s)://127.0.0.1:port/video."""

    def __init__(
        self,
        fps: float = 25.0,
        width: int = 160,
        height: int = 120,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(fps, width, height)
        self.tls = tls
        self.scheme = "https" if tls else "http"

    def serve(self, conn: socket.socket) -> None:
        if self.tls:
            conn = self.tls.wrap_socket(conn, server_side=True)
        if self.read_request(conn, bytearray()) is None:
            return
        conn.sendall(
            b"HTTP/1.0 200 OK\r\n"
            b"Cache-Control: no-cache\r\n"
            b"Connection: close\r\n"
            b"Content-Type: multipart/x-mixed-replace;boundary=" + BOUNDARY.encode() + b"\r\n"
            b"\r\n"
        )
        for data in self.cards():
            conn.sendall(
                f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
                + b"\r\n"
            )
