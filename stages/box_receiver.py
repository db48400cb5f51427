"""Person boxes from an external detector over ZeroMQ (detect's person = "zmq"): the box message
format (docs/configuration.md) decoded and checked within its limits (boxes per message,
bytes per message), and a SUB socket on its own thread keeping each camera's latest boxes.
No message can stop that thread; if it stops anyway, `failure` says why (detect reports it)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import zmq

from pipeline.errors import NpucamError
from pipeline.messages import now_ns
from pipeline.security import Curve, SocketSecurity

log = logging.getLogger(__name__)
MALFORMED_LOGGED = 5  # external box messages logged in full; then one line per 100
MAX_BOXES = 256  # boxes in one message (detect's boxes_max_per_message)
MAX_MESSAGE_BYTES = 1 << 20  # bytes in one message (detect's boxes_max_message_bytes)


FLOAT32_MAX = float(np.finfo(np.float32).max)


class BoxMessageError(NpucamError):
    """An external detector's box message that does not follow the documented format."""


class BoxReceiverError(NpucamError):
    """A box receiver that cannot connect to its endpoint."""


@dataclass(frozen=True, slots=True)
class ExternalBoxes:
    """One decoded box message: camera, boxes float32 [N, 4] (x, y, w, h) in frame pixels,
    scores float32 [N], and the optional seq and ts (ns) the sender attached."""

    camera: str
    boxes: np.ndarray
    scores: np.ndarray
    seq: int | None = None
    ts_ns: int | None = None


def _int_or_none(msg: dict, key: str) -> int | None:
    value = msg.get(key)
    if value is None:
        return None
    if type(value) is not int:  # noqa: E721 - a bool is not a seq
        raise BoxMessageError(f"'{key}' must be an integer, got {value!r}")
    return value


def _fits_float32(v: int | float) -> bool:
    """True for a finite number float32 can hold (a huge JSON integer would overflow)."""
    if isinstance(v, float) and not math.isfinite(v):
        return False
    return abs(v) <= FLOAT32_MAX  # exact for ints of any size


def _short(value: object) -> str:
    """A value for an error message: its repr, cut to 80 characters."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for int -> str (sys.get_int_max_str_digits)
        text = f"<{type(value).__name__} too long to print>"
    return text if len(text) <= 80 else text[:77] + "..."


def decode_box_message(
    raw: bytes,
    cameras: Sequence[str] | None = None,
    max_boxes: int = MAX_BOXES,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> ExternalBoxes:
    """Parse one external-detector message (docs/configuration.md, person = "zmq").

    raw: UTF-8 JSON object {"camera": str, "boxes": [[x, y, w, h], ...], "scores": [...]
    (optional, default 1.0), "seq": int (optional), "ts": int ns (optional)}, at most
    max_bytes long with at most max_boxes boxes. cameras: the names accepted (None: any).
    BoxMessageError says what is wrong; nothing else escapes for any input.
    """
    if len(raw) > max_bytes:
        raise BoxMessageError(f"{len(raw)} bytes, over the {max_bytes}-byte limit")
    try:
        msg = json.loads(bytes(raw))
    except RecursionError:
        raise BoxMessageError("JSON nested too deeply") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer over Python's digit limit
        raise BoxMessageError(f"not UTF-8 JSON: {exc}") from None
    if not isinstance(msg, dict):
        raise BoxMessageError(f"expected a JSON object, got {type(msg).__name__}")
    camera = msg.get("camera")
    if not isinstance(camera, str) or not camera:
        raise BoxMessageError(f"'camera' must be a non-empty string, got {_short(camera)}")
    if cameras is not None and camera not in cameras:
        raise BoxMessageError(f"camera {_short(camera)} is not one of {', '.join(cameras)}")
    where = f"camera {camera!r}"
    boxes = msg.get("boxes")
    if not isinstance(boxes, list):
        raise BoxMessageError(
            f"{where}: 'boxes' must be a list of [x, y, w, h], got {_short(boxes)}"
        )
    if len(boxes) > max_boxes:
        raise BoxMessageError(
            f"{where}: {len(boxes)} boxes, over the limit of {max_boxes} per message "
            "(boxes_max_per_message)"
        )
    rows = []
    for i, box in enumerate(boxes):
        if not (
            isinstance(box, list)
            and len(box) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
        ):
            raise BoxMessageError(
                f"{where}: boxes[{i}] must be 4 numbers [x, y, w, h]: {_short(box)}"
            )
        if not all(_fits_float32(v) for v in box) or box[2] <= 0 or box[3] <= 0:
            raise BoxMessageError(
                f"{where}: boxes[{i}] = {_short(box)} needs finite float32 values and w, h > 0"
            )
        # detect works in corners: x + w and y + h must fit float32 too (1e38 + 3e38 is inf)
        if not (_fits_float32(box[0] + box[2]) and _fits_float32(box[1] + box[3])):
            raise BoxMessageError(
                f"{where}: boxes[{i}] = {_short(box)}: x + w or y + h is beyond float32"
            )
        rows.append(box)
    scores = msg.get("scores", [1.0] * len(rows))
    if not (
        isinstance(scores, list)
        and len(scores) == len(rows)
        and all(isinstance(s, int | float) and not isinstance(s, bool) for s in scores)
    ):
        raise BoxMessageError(
            f"{where}: 'scores' must be {len(rows)} numbers, got {_short(scores)}"
        )
    if not all(0 <= s <= 1 for s in scores):
        raise BoxMessageError(f"{where}: scores must lie in [0, 1], got {_short(scores)}")
    return ExternalBoxes(
        camera=camera,
        boxes=np.array(rows, np.float32).reshape(-1, 4),
        scores=np.array(scores, np.float32).reshape(-1),
        seq=_int_or_none(msg, "seq"),
        ts_ns=_int_or_none(msg, "ts"),
    )


class BoxReceiver:
    """Person boxes from an external detector: a SUB socket connected to `endpoint` in a
    thread, keeping each camera's latest message. Each message is one JSON part (or
    [topic, JSON]: the last part is read). Malformed ones (decode_box_message: also over
    max_boxes or max_bytes) are counted in `malformed` (and as `error` drops of the stage)
    and skipped; nothing a peer sends stops the thread.

    libzmq drops a connection that sends a message over ZMQ_MAXMSGSIZE and does not
    reconnect it, so the socket watches its own disconnects and reconnects (`reconnects`).
    If the thread ends for any other reason than close(), `failure` holds the exception."""

    def __init__(
        self,
        endpoint: str,
        cameras: Sequence[str],
        on_malformed: Callable[[str], None] = lambda camera: None,
        curve: Curve | None = None,
        socket_name: str = "detect boxes",
        max_boxes: int = MAX_BOXES,
        max_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.endpoint = endpoint
        self.cameras = tuple(cameras)
        self.max_boxes = max_boxes
        self.max_bytes = max_bytes
        self.malformed = 0
        self.received = 0
        self.reconnects = 0
        self.failure: BaseException | None = None
        self._on_malformed = on_malformed
        self._latest: dict[str, tuple[int, ExternalBoxes]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._guard = SocketSecurity(self._ctx, curve, socket_name)
        self._sock = self._ctx.socket(zmq.SUB)
        self._monitor: zmq.Socket | None = None
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        # one byte over the limit: decode_box_message names the size; bigger, libzmq drops it
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_bytes + 1)
        try:
            self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._guard.connect(self._sock, endpoint)
        except zmq.ZMQError as exc:
            self._release()
            raise BoxReceiverError(f"{socket_name}: cannot connect to {endpoint}: {exc}") from None
        except BaseException:
            self._release()
            raise
        self._thread = threading.Thread(target=self._loop, name="detect-boxes", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            poller = zmq.Poller()
            poller.register(self._sock, zmq.POLLIN)
            poller.register(self._monitor, zmq.POLLIN)
            while not self._stop.is_set():
                self._receive_once(poller)
        except BaseException as exc:  # not a message's fault (handle() takes any): report it
            self.failure = exc
            log.exception("%s: the box receiver stopped", self.endpoint)
        finally:
            self._release()

    def _receive_once(self, poller: zmq.Poller) -> None:
        """Wait up to 100 ms; take one message, and reconnect after a dropped connection."""
        ready = dict(poller.poll(100))
        if self._monitor in ready:
            while self._monitor.poll(0):
                self._monitor.recv_multipart()
            # after a protocol error (a message over MAXMSGSIZE) libzmq would not reconnect
            self._sock.disconnect(self.endpoint)
            self._sock.connect(self.endpoint)
            self.reconnects += 1
            if self.reconnects <= MALFORMED_LOGGED or self.reconnects % 100 == 0:
                log.warning(
                    "%s: box connection dropped (a message over %d bytes, or the detector "
                    "went away); reconnecting (%d so far)",
                    self.endpoint,
                    self.max_bytes,
                    self.reconnects,
                )
        if self._sock in ready:
            parts = self._sock.recv_multipart(zmq.NOBLOCK)
            self.handle(parts[-1])

    def _release(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self._monitor.close(0)
        self._sock.close(0)
        self._guard.close()
        self._ctx.term()

    def handle(self, raw: bytes) -> ExternalBoxes | None:
        """Decode one message and keep it as its camera's latest; None if malformed (any
        failure to decode it, expected or not, counts as malformed and is logged)."""
        try:
            boxes = decode_box_message(raw, self.cameras, self.max_boxes, self.max_bytes)
        except Exception as exc:
            self._malformed(raw, exc)
            return None
        with self._lock:
            self._latest[boxes.camera] = (now_ns(), boxes)
            self.received += 1
        return boxes

    def _malformed(self, raw: bytes, exc: Exception) -> None:
        self.malformed += 1
        camera = ""
        if len(raw) <= self.max_bytes:
            with contextlib.suppress(Exception):
                camera = str(json.loads(raw).get("camera", ""))
        self._on_malformed(camera if camera in self.cameras else "")
        if self.malformed <= MALFORMED_LOGGED or self.malformed % 100 == 0:
            log.warning(
                "%s: malformed box message #%d skipped: %s",
                self.endpoint,
                self.malformed,
                exc,
                exc_info=None if isinstance(exc, BoxMessageError) else exc,
            )

    def latest(self, camera: str, max_age_ns: int, at_ns: int | None = None) -> ExternalBoxes:
        """The camera's latest boxes if received within max_age_ns, else no boxes."""
        at = now_ns() if at_ns is None else at_ns
        with self._lock:
            got = self._latest.get(camera)
        if got is None or at - got[0] > max_age_ns:
            return ExternalBoxes(camera, np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
        return got[1]

    def close(self) -> None:
        """Stop the thread, which closes the socket and terminates the context (blocking: up
        to its 100 ms poll, at most 2 s)."""
        self._stop.set()
        self._thread.join(timeout=2.0)
