"""The ZeroMQ output contract: multipart `[topic, header JSON, *binary parts]` (docs/protocol.md).

The header carries the schema version `v`, `kind`, `camera`, `seq`, `capture_ts` and
`publish_ts` (wall clock, ns; also as decimal strings `capture_ts_str`, `publish_ts_str`,
since ns integers exceed the 2^53 a JSON reader with doubles holds exactly), `backend`,
`model`, `synthetic`, kind-specific fields, and `parts`: one descriptor per binary part with
its name, dtype, shape and byte order, so a subscriber in any language can rebuild each array
without knowing npucam. decode() reads a header only within HEADER_LIMITS
(pipeline/bounded_json.py) and raises only WireError.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring_ascii

import numpy as np

from pipeline.bounded_json import JsonLimitError, JsonLimits, loads
from pipeline.errors import NpucamError
from pipeline.messages import Result

SCHEMA_VERSION = 1
COMMON_FIELDS = (
    "v",
    "kind",
    "camera",
    "seq",
    "capture_ts",
    "publish_ts",
    "backend",
    "model",
    "synthetic",
)
TIMESTAMP_FIELDS = ("capture_ts", "publish_ts")  # ns integers, each also sent as `<key>_str`
DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "uint32", "int64", "float32", "float64")
# Encoded images (preview JPEGs) travel as uint8 [nbytes] with "encoding": "jpeg".
ENCODINGS = ("jpeg",)
# What a subscriber parses of a header: far above any header npucam sends (a `stats` header of
# 64 cameras is ~100 KB, nested ~6 deep; integers are ns timestamps and counts).
HEADER_LIMITS = JsonLimits(max_bytes=16 << 20, max_depth=32, max_string=1 << 20, max_int_digits=40)


class WireError(NpucamError):
    """A message does not follow the protocol; the text says which part and why."""


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded message: its topic, header and binary parts by name."""

    topic: str
    header: dict
    arrays: dict[str, np.ndarray]


def _byteorder(dtype: np.dtype) -> str:
    if dtype.itemsize == 1:
        return "none"
    order = dtype.byteorder
    if order == "=":
        order = "<" if sys.byteorder == "little" else ">"
    return "little" if order == "<" else "big"


# json.dumps(obj, separators=(",", ":")), without its per-call cost: JSONEncoder.encode builds
# the C encoder (and a circular-reference table) on every call; this one is built once. The
# bytes are the same; only a self-containing header fails differently (RecursionError).
_ENCODER = json.JSONEncoder(separators=(",", ":"))
if c_make_encoder is not None:
    _chunks = c_make_encoder(
        None, _ENCODER.default, encode_basestring_ascii, None, ":", ",", False, False, True
    )

    def _dumps(obj: object) -> str:
        return "".join(_chunks(obj, 0))

else:  # no C accelerator (not CPython): the pure-Python encoder
    _dumps = _ENCODER.encode
# dtype -> (name, byteorder); numpy's dtype.name is slow enough to matter per message.
_DTYPE_INFO: dict[np.dtype, tuple[str, str]] = {}


def part_descriptor(name: str, array: np.ndarray, encoding: str | None = None) -> dict:
    """The header entry that describes one binary part."""
    return _descriptor(name, array.dtype, array.shape, encoding)


def _descriptor(name: str, dtype: np.dtype, shape: tuple, encoding: str | None) -> dict:
    info = _DTYPE_INFO.get(dtype)
    if info is None:
        info = _DTYPE_INFO[dtype] = (dtype.name, _byteorder(dtype))
    desc = {"name": name, "dtype": info[0], "shape": list(shape), "byteorder": info[1]}
    if encoding is not None:
        desc["encoding"] = encoding
    return desc


def encode(
    topic: str,
    header: dict,
    arrays: Sequence[tuple[str, np.ndarray]] = (),
    encodings: dict[str, str] | None = None,
) -> list:
    """[topic, header JSON, *parts]; header gets `v`, the string forms of its ns timestamps
    and the `parts` descriptors.

    arrays: named numpy arrays in wire order; each is sent C-contiguous, in native byte order.
    encodings: part name -> encoding ("jpeg") for parts that hold an encoded image.
    """
    full = {"v": SCHEMA_VERSION, **header}
    for key in TIMESTAMP_FIELDS:
        if key in header:
            full[f"{key}_str"] = str(header[key])
    return _finish(topic, full, arrays, encodings)


def _parts(
    arrays: Sequence[tuple[str, np.ndarray]], encodings: dict[str, str] | None
) -> tuple[tuple, list]:
    """Each part's (name, dtype, shape, encoding) key and its buffer, sent C-contiguous."""
    keys, buffers = [], []
    for name, a in arrays:
        if not isinstance(a, np.ndarray) or a.ndim == 0 or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        keys.append((name, a.dtype, a.shape, encodings.get(name) if encodings else None))
        buffers.append(a.data if a.nbytes else b"")
    return tuple(keys), buffers


def _finish(
    topic: str,
    full: dict,
    arrays: Sequence[tuple[str, np.ndarray]],
    encodings: dict[str, str] | None,
) -> list:
    """[topic, header JSON, *parts] from the header so far (`parts` is added here, last)."""
    keys, buffers = _parts(arrays, encodings)
    if "parts" in full:  # a caller's own `parts` key keeps its place in the object
        full["parts"] = [_descriptor(*key) for key in keys]
        return [topic.encode(), _dumps(full).encode(), *buffers]
    head = _dumps(full)
    sep = "," if len(head) > 2 else ""
    return [topic.encode(), f"{head[:-1]}{sep}{_parts_json(keys)}}}".encode(), *buffers]


# (name, dtype, shape, encoding) per part -> its `"parts":[...]` JSON; results of one kind
# repeat a handful of shapes, so encoding the descriptors once per shape is most of their cost.
_PARTS_JSON: dict[tuple, str] = {}
_PARTS_JSON_LIMIT = 4096  # shapes a peer cannot choose, but many boxes counts: bounded anyway


def _parts_json(keys: tuple) -> str:
    text = _PARTS_JSON.get(keys)
    if text is None:
        descs = [_descriptor(*key) for key in keys]
        text = '"parts":' + _dumps(descs)
        if len(_PARTS_JSON) >= _PARTS_JSON_LIMIT:
            _PARTS_JSON.clear()
        _PARTS_JSON[keys] = text
    return text


# Keys encode_result writes itself; header_fields() naming one takes the general path, where
# the dict merge decides its place and value.
_RESULT_KEYS = frozenset((*COMMON_FIELDS, *(f"{k}_str" for k in TIMESTAMP_FIELDS), "parts"))


def encode_result(result: Result, publish_ts_ns: int) -> list:
    """The wire form of one result, on topic `<kind>/<camera>`: byte for byte what encode()
    writes, with the common fields formatted directly (ints and strings as the JSON encoder
    writes them) and only the kind's own fields through the encoder."""
    fields = result.header_fields()
    seq, capture_ts = result.seq, result.capture_ts_ns
    if (
        type(seq) is not int  # noqa: E721 - bools and int subclasses go through the encoder
        or type(capture_ts) is not int  # noqa: E721
        or type(publish_ts_ns) is not int  # noqa: E721
        or not _RESULT_KEYS.isdisjoint(fields)
    ):
        return _encode_result_dict(result, fields, publish_ts_ns)
    names = (result.kind, result.camera, result.backend, result.model, result.synthetic)
    head = _HEADS.get(names)
    if head is None:
        head = _head(names)
        if head is None:
            return _encode_result_dict(result, fields, publish_ts_ns)
    own = _dumps(fields)[1:-1] + "," if fields else ""
    header = (
        f'{head[0]}{seq},"capture_ts":{capture_ts},"publish_ts":{publish_ts_ns},{head[1]}'
        f'{own}"capture_ts_str":"{capture_ts}","publish_ts_str":"{publish_ts_ns}",'
    )
    keys, buffers = _parts(result.arrays(), None)
    header += _parts_json(keys) + "}"
    return [result.topic.encode(), header.encode(), *buffers]


# (kind, camera, backend, model, synthetic) -> the JSON before seq and between publish_ts and
# the kind's fields; bounded like _PARTS_JSON.
_HEADS: dict[tuple, tuple[str, str]] = {}


def _head(names: tuple) -> tuple[str, str] | None:
    kind, camera, backend, model, synthetic = names
    if not all(type(s) is str for s in names[:4]) or type(synthetic) is not bool:  # noqa: E721
        return None
    before = _dumps({"v": SCHEMA_VERSION, "kind": kind, "camera": camera})[:-1] + ',"seq":'
    after = _dumps({"backend": backend, "model": model, "synthetic": synthetic})[1:-1] + ","
    if len(_HEADS) >= _PARTS_JSON_LIMIT:
        _HEADS.clear()
    _HEADS[names] = (before, after)
    return before, after


def _encode_result_dict(result: Result, fields: dict, publish_ts_ns: int) -> list:
    full = {
        "v": SCHEMA_VERSION,
        "kind": result.kind,
        "camera": result.camera,
        "seq": result.seq,
        "capture_ts": result.capture_ts_ns,
        "publish_ts": publish_ts_ns,
        "backend": result.backend,
        "model": result.model,
        "synthetic": result.synthetic,
        **fields,
    }
    full["capture_ts_str"] = str(result.capture_ts_ns)
    full["publish_ts_str"] = str(publish_ts_ns)
    return _finish(result.topic, full, result.arrays(), None)


def decode(parts: Sequence[bytes]) -> Message:
    """Parse and check one multipart message; WireError names what is wrong."""
    if len(parts) < 2:
        raise WireError(f"message has {len(parts)} part(s); expected [topic, header, *parts]")
    try:
        topic = bytes(parts[0]).decode()
    except UnicodeDecodeError as exc:
        raise WireError(f"topic is not UTF-8: {exc}") from None
    try:
        header = loads(bytes(parts[1]), HEADER_LIMITS)
    except JsonLimitError as exc:
        raise WireError(f"{topic}: header: {exc}") from None
    if not isinstance(header, dict):
        raise WireError(f"{topic}: header is not a JSON object")
    missing = [k for k in COMMON_FIELDS if k not in header]
    if missing:
        raise WireError(f"{topic}: header lacks {', '.join(missing)}")
    if header["v"] != SCHEMA_VERSION:
        raise WireError(
            f"{topic}: schema version {header['v']!r}; this reader knows {SCHEMA_VERSION}"
        )
    descs = header.get("parts", [])
    if not isinstance(descs, list) or len(descs) != len(parts) - 2:
        raise WireError(
            f"{topic}: header describes {len(descs) if isinstance(descs, list) else '?'} "
            f"binary part(s), message has {len(parts) - 2}"
        )
    arrays: dict[str, np.ndarray] = {}
    for i, (desc, raw) in enumerate(zip(descs, parts[2:], strict=True)):
        name = _part_name(topic, i, desc)  # first: `a[k] = v` evaluates v before k
        arrays[name] = _decode_part(topic, i, desc, raw)
    return Message(topic, header, arrays)


def _part_name(topic: str, i: int, desc: object) -> str:
    if not isinstance(desc, dict) or not isinstance(desc.get("name"), str):
        raise WireError(f"{topic}: parts[{i}] has no name")
    return desc["name"]


def _decode_part(topic: str, i: int, desc: dict, raw: bytes) -> np.ndarray:
    where = f"{topic}: parts[{i}] ({desc['name']})"
    dtype_name, shape, order = desc.get("dtype"), desc.get("shape"), desc.get("byteorder")
    if dtype_name not in DTYPES:
        raise WireError(f"{where}: dtype {dtype_name!r} is not one of {', '.join(DTYPES)}")
    if not (
        isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)  # noqa: E721 - bools are not sizes
    ):
        raise WireError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    dtype = np.dtype(dtype_name)
    if order not in ("little", "big", "none") or (order == "none") != (dtype.itemsize == 1):
        raise WireError(f"{where}: byteorder {order!r} does not fit dtype {dtype_name}")
    if "encoding" in desc and desc["encoding"] not in ENCODINGS:
        raise WireError(f"{where}: unknown encoding {desc['encoding']!r}")
    expected = math.prod(shape) * dtype.itemsize
    buf = memoryview(raw)
    if buf.nbytes != expected:
        raise WireError(f"{where}: {buf.nbytes} bytes; dtype and shape say {expected}")
    if order != "none":
        dtype = dtype.newbyteorder("<" if order == "little" else ">")
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
