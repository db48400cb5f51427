"""Frames between processes: the ZeroMQ wire format of a Frame (`zmq` sink PUSH, source PULL).

A frame travels as one ZeroMQ multipart message of exactly two parts:

1. header: a UTF-8 JSON object with the fields

   | field           | JSON type | meaning                                                    |
   |-----------------|-----------|------------------------------------------------------------|
   | `v`             | integer   | wire version, `1`                                          |
   | `camera`        | string    | camera name at the sender                                  |
   | `seq`           | integer   | sender's per-camera frame number, >= 0                     |
   | `capture_ts_ns` | integer   | wall-clock grab time, ns since the Unix epoch              |
   | `deadline_ns`   | integer   | capture_ts_ns + the sender's staleness budget, ns          |
   | `source`        | string    | the sender's description of its source                     |
   | `encoding`      | string    | `"jpeg"` or `"raw"`                                        |
   | `shape`         | array     | `[H, W, 3]`, 1 <= H, W <= 16384                            |
   | `dtype`         | string    | `"uint8"`                                                  |

   Booleans are not integers here. Unknown fields are ignored, so a later version can add
   fields without breaking version-1 readers. Limits (HEADER_LIMITS), checked before the
   JSON is parsed: at most 8 KiB, nested at most 4 deep, no string over 1024 bytes as written
   (encode_frame shortens `camera` and `source` to fit), no number over 20 digits.

2. payload: the image.
   - `raw`: the H*W*3 bytes of a C-contiguous uint8 [H, W, 3] array, row-major, no padding,
     channels in B, G, R order per pixel (OpenCV's); byte order does not apply to uint8.
   - `jpeg`: a standard JFIF JPEG (baseline or progressive, as cv2.imencode writes it) of
     exactly H x W pixels. Decoders that return RGB give the frame's channels reversed; a
     greyscale JPEG is accepted and expanded to 3 equal channels.

Sockets: the sender PUSHes from a socket with a bounded SNDHWM (the zmq_push stage,
stages/frame_push.py); a `zmq:tcp://HOST:PORT` camera (stages.sources) connects a PULL
socket with RCVHWM 1 and MAXMSGSIZE = its max_pixels x 3 + 64 KiB, so a slow receiver makes
the sender's PUSH hit its high-water mark instead of queueing old frames. There is no topic
part: PUSH/PULL is point to point, and every frame on one endpoint belongs to the camera
that PULLs it (seq and capture_ts_ns are kept there, stages/sources.py). With `[security]` both
ends run CURVE (pipeline.security); the message format is the same.

decode_frame checks every field and the payload against the header and raises FrameWireError
naming what is wrong; it raises nothing else, whatever the input bytes. A frame of more than
max_pixels (the camera's `max_pixels`) is refused from its header, and a JPEG whose SOF
segment does not give the header's size is refused before it is decoded, so no message makes
the receiver allocate more than max_pixels * 3 bytes for its image.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import cv2
import numpy as np
import zmq

from pipeline.bounded_json import JsonLimitError, JsonLimits, loads
from pipeline.config import DEFAULT_MAX_PIXELS
from pipeline.errors import NpucamError
from pipeline.jpeg import JpegError, jpeg_info
from pipeline.messages import Frame

WIRE_VERSION = 1
ENCODINGS = ("jpeg", "raw")
MAX_SIDE = 16384
HEADER_LIMITS = JsonLimits(max_bytes=8192, max_depth=4, max_string=1024, max_int_digits=20)


class FrameWireError(NpucamError):
    """A frame message that does not follow the wire format, or a frame that cannot be sent."""


def encode_frame(frame: Frame, fmt: str = "jpeg", quality: int = 90) -> list[bytes | memoryview]:
    """[header JSON, payload] for frame; image uint8 [H, W, 3] BGR; fmt "jpeg" or "raw".

    A raw payload is a flat uint8 memoryview of the image itself when it is C-contiguous (no
    copy: send it with copy=False, and leave the image unchanged until libzmq is done with
    it), of a contiguous copy otherwise; a JPEG payload is bytes.
    """
    image = frame.image
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3:
        raise FrameWireError(
            f"camera {frame.camera!r} seq {frame.seq}: image must be uint8 [H, W, 3], got "
            f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}"
        )
    h, w, c = image.shape
    if c != 3 or not (1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise FrameWireError(
            f"camera {frame.camera!r} seq {frame.seq}: image shape {image.shape} is not "
            f"[H, W, 3] with 1 <= H, W <= {MAX_SIDE}"
        )
    if fmt == "raw":
        payload = memoryview(np.ascontiguousarray(image).reshape(-1))
    elif fmt == "jpeg":
        if not 1 <= quality <= 100:
            raise FrameWireError(f"jpeg quality must be in 1..100, got {quality}")
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        if not ok:
            raise FrameWireError(f"camera {frame.camera!r} seq {frame.seq}: JPEG encode failed")
        payload = buf.tobytes()
    else:
        raise FrameWireError(f"frame encoding must be one of {ENCODINGS}, got {fmt!r}")
    header = {
        "v": WIRE_VERSION,
        "camera": _fit(frame.camera),
        "seq": int(frame.seq),
        "capture_ts_ns": int(frame.capture_ts_ns),
        "deadline_ns": int(frame.deadline_ns),
        "source": _fit(frame.source),
        "encoding": fmt,
        "shape": [h, w, 3],
        "dtype": "uint8",
    }
    return [json.dumps(header, separators=(",", ":")).encode(), payload]


def _fit(text: str) -> str:
    """text shortened until its JSON literal fits HEADER_LIMITS.max_string."""
    limit = HEADER_LIMITS.max_string
    while (n := len(json.dumps(text)) - 2) > limit:
        text = text[: min(len(text) - 1, len(text) * limit // n)]
    return text


def decode_frame(parts: Sequence, max_pixels: int = DEFAULT_MAX_PIXELS) -> Frame:
    """The Frame a [header, payload] message carries; FrameWireError for any malformed input,
    or for a frame of more than max_pixels.

    parts: bytes-like objects (bytes, bytearray, memoryview, or zmq.Frame as
    recv_multipart(copy=False) gives them). A raw image is a view of a writable payload (a
    zmq.Frame's memory: no copy; the array keeps the message alive) and a copy of a read-only
    one, so the image is always writable.
    """
    if not isinstance(parts, (list, tuple)) or len(parts) != 2:
        n = len(parts) if isinstance(parts, (list, tuple)) else type(parts).__name__
        raise FrameWireError(f"frame message must have 2 parts (header, payload), got {n}")
    if not all(isinstance(p, (bytes, bytearray, memoryview, zmq.Frame)) for p in parts):
        raise FrameWireError("frame message parts must be bytes")
    try:
        raw_header, payload = bytes(parts[0]), memoryview(parts[1]).cast("B")
    except TypeError:  # a memoryview that is not contiguous
        raise FrameWireError("frame message payload must be contiguous bytes") from None
    try:
        header = loads(raw_header, HEADER_LIMITS)
    except JsonLimitError as exc:
        raise FrameWireError(f"frame header: {exc}") from None
    if not isinstance(header, dict):
        raise FrameWireError(f"frame header must be a JSON object, got {type(header).__name__}")

    version = _field(header, "v", int)
    if version != WIRE_VERSION:
        raise FrameWireError(f"frame header v: unsupported version {version} (expected 1)")
    camera = _field(header, "camera", str)
    seq = _field(header, "seq", int)
    if seq < 0:
        raise FrameWireError(f"frame header seq: must be >= 0, got {seq}")
    capture_ts_ns = _field(header, "capture_ts_ns", int)
    deadline_ns = _field(header, "deadline_ns", int)
    source = _field(header, "source", str)
    encoding = _field(header, "encoding", str)
    if encoding not in ENCODINGS:
        raise FrameWireError(
            f"frame header encoding: expected one of {ENCODINGS}, got {encoding!r}"
        )
    dtype = _field(header, "dtype", str)
    if dtype != "uint8":
        raise FrameWireError(f"frame header dtype: expected 'uint8', got {dtype!r}")
    shape = _field(header, "shape", list)
    if (
        len(shape) != 3
        or not all(type(s) is int for s in shape)
        or shape[2] != 3
        or not (1 <= shape[0] <= MAX_SIDE and 1 <= shape[1] <= MAX_SIDE)
    ):
        raise FrameWireError(
            f"frame header shape: expected [H, W, 3] with 1 <= H, W <= {MAX_SIDE}, got {shape!r}"
        )
    h, w = shape[0], shape[1]
    if h * w > max_pixels:
        raise FrameWireError(
            f"camera {camera!r} seq {seq}: frame header shape {h}x{w} is {h * w} pixels, over "
            f"the limit of {max_pixels} (max_pixels)"
        )

    if encoding == "raw":
        if len(payload) != h * w * 3:
            raise FrameWireError(
                f"camera {camera!r} seq {seq}: raw payload has {len(payload)} bytes, "
                f"shape {shape} needs {h * w * 3}"
            )
        image = np.frombuffer(payload, np.uint8).reshape(h, w, 3)
        if not image.flags.writeable:
            image = image.copy()
    else:
        image = _decode_jpeg(payload, h, w, f"camera {camera!r} seq {seq}")
    return Frame(camera, seq, capture_ts_ns, deadline_ns, image, source)


def _field(header: dict, key: str, kind: type):
    if key not in header:
        raise FrameWireError(f"frame header: missing field {key!r}")
    value = header[key]
    if type(value) is not kind:
        raise FrameWireError(
            f"frame header {key}: expected {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _decode_jpeg(payload: memoryview, h: int, w: int, what: str) -> np.ndarray:
    # The size and scans are read from the markers first so a hostile JPEG cannot make the
    # decoder allocate a huge image the header did not announce, nor run scan after scan.
    try:
        info = jpeg_info(payload)
    except JpegError as exc:
        raise FrameWireError(f"{what}: {exc}") from None
    size = (info.height, info.width)
    if size != (h, w):
        raise FrameWireError(f"{what}: JPEG is {size[0]}x{size[1]}, header shape says {h}x{w}")
    try:
        image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as exc:
        raise FrameWireError(f"{what}: JPEG decode failed: {exc}") from None
    if image is None or image.shape != (h, w, 3):
        raise FrameWireError(f"{what}: JPEG payload could not be decoded")
    return image
