"""Person boxes from an external detector over ZeroMQ (detect's person = "zmq"): the box message
format (docs/configuration.md) decoded and checked, and a SUB socket on its own thread keeping
each camera's latest boxes."""

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


def decode_box_message(raw: bytes, cameras: Sequence[str] | None = None) -> ExternalBoxes:
    """Parse one external-detector message (docs/configuration.md, person = "zmq").

    raw: UTF-8 JSON object {"camera": str, "boxes": [[x, y, w, h], ...], "scores": [...]
    (optional, default 1.0), "seq": int (optional), "ts": int ns (optional)}. cameras: the
    names accepted (None: any). BoxMessageError says what is wrong.
    """
    try:
        msg = json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BoxMessageError(f"not UTF-8 JSON: {exc}") from None
    except RecursionError:
        raise BoxMessageError("JSON nested too deeply") from None
    if not isinstance(msg, dict):
        raise BoxMessageError(f"expected a JSON object, got {type(msg).__name__}")
    camera = msg.get("camera")
    if not isinstance(camera, str) or not camera:
        raise BoxMessageError(f"'camera' must be a non-empty string, got {camera!r}")
    if cameras is not None and camera not in cameras:
        raise BoxMessageError(f"camera {camera!r} is not one of {', '.join(cameras)}")
    where = f"camera {camera!r}"
    boxes = msg.get("boxes")
    if not isinstance(boxes, list):
        raise BoxMessageError(f"{where}: 'boxes' must be a list of [x, y, w, h], got {boxes!r}")
    rows = []
    for i, box in enumerate(boxes):
        if not (
            isinstance(box, list)
            and len(box) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
        ):
            raise BoxMessageError(f"{where}: boxes[{i}] must be 4 numbers [x, y, w, h]: {box!r}")
        if not all(_fits_float32(v) for v in box) or box[2] <= 0 or box[3] <= 0:
            raise BoxMessageError(
                f"{where}: boxes[{i}] = {box} needs finite float32 values and w, h > 0"
            )
        rows.append(box)
    scores = msg.get("scores", [1.0] * len(rows))
    if not (
        isinstance(scores, list)
        and len(scores) == len(rows)
        and all(isinstance(s, int | float) and not isinstance(s, bool) for s in scores)
    ):
        raise BoxMessageError(f"{where}: 'scores' must be {len(rows)} numbers, got {scores!r}")
    if not all(0 <= s <= 1 for s in scores):
        raise BoxMessageError(f"{where}: scores must lie in [0, 1], got {scores}")
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
    [topic, JSON]: the last part is read). Malformed ones are counted in `malformed` (and as
    `error` drops of the stage) and skipped."""

    def __init__(
        self,
        endpoint: str,
        cameras: Sequence[str],
        on_malformed: Callable[[str], None] = lambda camera: None,
        curve: Curve | None = None,
        socket_name: str = "detect boxes",
    ) -> None:
        self.endpoint = endpoint
        self.cameras = tuple(cameras)
        self.malformed = 0
        self.received = 0
        self._on_malformed = on_malformed
        self._latest: dict[str, tuple[int, ExternalBoxes]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._guard = SocketSecurity(self._ctx, curve, socket_name)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        try:
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
            while not self._stop.is_set():
                if not self._sock.poll(100):
                    continue
                parts = self._sock.recv_multipart()
                self.handle(parts[-1])
        finally:
            self._release()

    def _release(self) -> None:
        self._sock.close(0)
        self._guard.close()
        self._ctx.term()

    def handle(self, raw: bytes) -> ExternalBoxes | None:
        """Decode one message and keep it as its camera's latest; None if malformed."""
        try:
            boxes = decode_box_message(raw, self.cameras)
        except BoxMessageError as exc:
            self.malformed += 1
            camera = ""
            with contextlib.suppress(Exception):
                camera = str(json.loads(raw).get("camera", ""))
            self._on_malformed(camera if camera in self.cameras else "")
            if self.malformed <= MALFORMED_LOGGED or self.malformed % 100 == 0:
                log.warning(
                    "%s: malformed box message #%d skipped: %s", self.endpoint, self.malformed, exc
                )
            return None
        with self._lock:
            self._latest[boxes.camera] = (now_ns(), boxes)
            self.received += 1
        return boxes

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
