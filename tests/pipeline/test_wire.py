"""The output protocol: results round-trip through encode/decode; malformed input is refused
with a WireError that says what is wrong."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import wire
from pipeline.messages import Detections, Frame, Result


def det() -> Detections:
    frame = Frame("cam-1", 7, 1_000, 2_000, np.zeros((48, 64, 3), np.uint8), "synthetic:")
    d = Detections.without_detector(frame)
    d.boxes = np.array([[1, 2, 30, 40], [5, 6, 7, 8]], np.float32)
    d.scores = np.array([0.9, 0.5], np.float32)
    d.labels = ("person", "face")
    return d


def test_detections_round_trip_with_every_header_field():
    parts = [bytes(p) for p in wire.encode_result(det(), publish_ts_ns=3_000)]
    msg = wire.decode(parts)
    assert msg.topic == "det/cam-1"
    h = msg.header
    assert {k: h[k] for k in wire.COMMON_FIELDS} == {
        "v": 1, "kind": "det", "camera": "cam-1", "seq": 7, "capture_ts": 1_000,
        "publish_ts": 3_000, "backend": "none", "model": "none", "synthetic": False,
    }  # fmt: skip
    assert (h["width"], h["height"], h["count"], h["labels"]) == (64, 48, 2, ["person", "face"])
    assert h["parts"][0] == {
        "name": "boxes", "dtype": "float32", "shape": [2, 4], "byteorder": "little"
    }  # fmt: skip
    np.testing.assert_array_equal(msg.arrays["boxes"], det().boxes)
    np.testing.assert_array_equal(msg.arrays["scores"], det().scores)


def test_big_endian_parts_decode_to_the_same_values():
    values = np.arange(6, dtype=">i4").reshape(2, 3)
    parts = [bytes(p) for p in wire.encode("t", {**_common(), "kind": "x"}, [("a", values)])]
    assert json.loads(parts[1])["parts"][0]["byteorder"] == "big"
    np.testing.assert_array_equal(wire.decode(parts).arrays["a"], np.arange(6).reshape(2, 3))


def _common() -> dict:
    return {k: 0 for k in wire.COMMON_FIELDS if k != "v"} | {"camera": "c", "backend": "none"}


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda p: p[:1], "expected \\[topic, header"),
        (lambda p: [p[0], b"{not json", *p[2:]], "header: not UTF-8 JSON"),
        (lambda p: [p[0], b"[1, 2]", *p[2:]], "not a JSON object"),
        (lambda p: [p[0], _edit(p[1], v=2), *p[2:]], "schema version 2"),
        (lambda p: [p[0], _edit(p[1], seq=None, drop="seq"), *p[2:]], "lacks seq"),
        (lambda p: p[:-1], "describes 2 binary part\\(s\\), message has 1"),
        (lambda p: [*p[:2], p[2][:-4], p[3]], "28 bytes; dtype and shape say 32"),
        (lambda p: [p[0], _part(p[1], dtype="object"), *p[2:]], "dtype 'object'"),
        (lambda p: [p[0], _part(p[1], shape=[-1, 4]), *p[2:]], "shape \\[-1, 4\\]"),
        (lambda p: [p[0], _part(p[1], byteorder="none"), *p[2:]], "byteorder 'none'"),
        (lambda p: [b"\xff\xfe", *p[1:]], "topic is not UTF-8"),
        (lambda p: [p[0], _part(p[1], shape=[2**40, 2**40]), *p[2:]], "dtype and shape say"),
        (lambda p: [p[0], _part(p[1], shape=[True, 4]), *p[2:]], "shape \\[True, 4\\]"),
    ],
)
def test_malformed_messages_raise_wire_error_naming_the_problem(mutate, reason):
    parts = [bytes(p) for p in wire.encode_result(det(), 3_000)]
    with pytest.raises(wire.WireError, match=reason):
        wire.decode(mutate(parts))


def _edit(raw: bytes, drop: str | None = None, **fields) -> bytes:
    header = json.loads(raw) | fields
    if drop:
        del header[drop]
    return json.dumps(header).encode()


def _part(raw: bytes, **fields) -> bytes:
    header = json.loads(raw)
    header["parts"][0] |= fields
    return json.dumps(header).encode()


DESC_KEYS = st.sampled_from(["name", "dtype", "shape", "byteorder", "encoding"])
DESC_VALUES = st.one_of(
    st.text(max_size=8),
    st.lists(st.integers(-1, 2**70), max_size=3),
    st.sampled_from(["float32", "uint8", "little", "none"]),
)
HEADER_VALUES = st.one_of(
    st.none(),
    st.integers(-2, 3),
    st.text(max_size=5),
    st.lists(st.dictionaries(DESC_KEYS, DESC_VALUES), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.binary(max_size=64), max_size=5),
    header=st.dictionaries(st.sampled_from([*wire.COMMON_FIELDS, "parts"]), HEADER_VALUES),
)
def test_decode_raises_only_wire_error_whatever_the_bytes(parts, header):
    for candidate in (parts, [b"t", json.dumps(header).encode(), *parts]):
        with contextlib.suppress(wire.WireError):
            wire.decode(candidate)


def test_ns_timestamps_also_travel_as_exact_decimal_strings():
    """A JSON reader whose numbers are doubles (JavaScript) rounds ~1.8e18 ns; the strings
    keep every digit."""
    capture, publish = 1_796_117_511_479_224_351, 1_796_117_511_479_224_999
    result = Result(kind="det", camera="c", seq=1, capture_ts_ns=capture, deadline_ns=capture)
    header = json.loads(wire.encode_result(result, publish)[1])
    assert (header["capture_ts_str"], header["publish_ts_str"]) == (str(capture), str(publish))
    as_double = json.loads(wire.encode_result(result, publish)[1], parse_int=float)
    assert int(as_double["capture_ts"]) != capture  # what JSON.parse would see
    assert int(as_double["capture_ts_str"]) == capture


def _reference_wire(result: Result, publish_ts: int) -> list[bytes]:
    """docs/protocol.md written out with json.dumps: the bytes encode_result must produce."""
    header = {
        "v": 1,
        "kind": result.kind,
        "camera": result.camera,
        "seq": result.seq,
        "capture_ts": result.capture_ts_ns,
        "publish_ts": publish_ts,
        "backend": result.backend,
        "model": result.model,
        "synthetic": result.synthetic,
        **result.header_fields(),
    }
    header["capture_ts_str"] = str(result.capture_ts_ns)
    header["publish_ts_str"] = str(publish_ts)
    arrays = [(name, np.ascontiguousarray(a)) for name, a in result.arrays()]
    header["parts"] = [
        {
            "name": name,
            "dtype": a.dtype.name,
            "shape": list(a.shape),
            "byteorder": "none" if a.dtype.itemsize == 1 else "little",
        }
        for name, a in arrays
    ]
    body = json.dumps(header, separators=(",", ":")).encode()
    return [result.topic.encode(), body, *(a.tobytes() for _, a in arrays)]


def _results() -> list[Result]:
    from stages.models.adaface.result import FaceResult
    from stages.models.clip.result import ClipResult
    from stages.models.sapiens2.result import PoseResult

    boxes = np.arange(24, dtype=np.float32).reshape(6, 4)[::2]  # not contiguous
    return [
        det(),
        Detections.without_detector(Frame("c", 0, 5, 6, np.zeros((4, 4, 3), np.uint8))),
        Detections(
            camera="kamera-é☃",
            seq=2**70,
            capture_ts_ns=1_796_117_511_479_224_351,
            deadline_ns=0,
            boxes=boxes,
            scores=np.array([0.5, np.nan, 1e-7], np.float32),
            labels=("ünï", "b", 'q"\\'),
            synthetic=True,
            model="m\n",
            extra={"note": 1.5, "nested": {"a": [None, True, float("inf")]}},
        ),
        PoseResult(camera="p", seq=3, capture_ts_ns=9, deadline_ns=9, since_previous_ms=2.25),
        FaceResult(camera="f", seq=4, capture_ts_ns=9, deadline_ns=9, identity="ann"),
        ClipResult(
            camera="k",
            seq=5,
            capture_ts_ns=9,
            deadline_ns=9,
            labels=("a", "b"),
            probabilities=np.array([0.25, 0.75], np.float32),
        ),
        Result(kind="x", camera="r", seq=6, capture_ts_ns=9, deadline_ns=9),
        # header fields that name common keys: the dict merge decides place and value
        Result(
            kind="x",
            camera="r",
            seq=7,
            capture_ts_ns=9,
            deadline_ns=9,
            extra={"camera": "other", "parts": 1, "capture_ts_str": "no", "z": 0},
        ),
        Result(kind="x", camera="r", seq=True, capture_ts_ns=9, deadline_ns=9),
    ]


@pytest.mark.parametrize("index", range(len(_results())))
def test_encode_result_writes_the_bytes_of_the_protocol_reference(index):
    result = _results()[index]
    for _ in range(2):  # the second time from the cached header and part fragments
        got = [bytes(p) for p in wire.encode_result(result, 1_796_117_511_479_229_999)]
        assert got == _reference_wire(result, 1_796_117_511_479_229_999)


def test_cached_part_fragments_follow_the_shape_of_each_message():
    d = det()
    for n in (2, 0, 5, 2):
        d.boxes = np.ones((n, 4), np.float32)
        d.scores = np.ones(n, np.float32)
        d.labels = ("x",) * n
        assert [bytes(p) for p in wire.encode_result(d, 3)] == _reference_wire(d, 3)


def test_encode_keeps_a_callers_parts_key_in_its_place():
    header = {"kind": "k", "parts": None, "camera": "c"}
    _, body, raw = wire.encode("t", header, [("a", np.arange(3, dtype=np.int32))])
    assert list(json.loads(body)) == ["v", "kind", "parts", "camera"]
    assert json.loads(body)["parts"][0]["shape"] == [3]
    assert bytes(raw) == np.arange(3, dtype=np.int32).tobytes()


def test_a_part_described_without_a_name_is_a_wire_error_not_a_key_error():
    # hypothesis found it (test_decode_raises_only_wire_error_whatever_the_bytes): the part
    # was decoded before its name was checked, and its error message read desc["name"]
    header = {"v": 1, "kind": None, "camera": None, "seq": None, "capture_ts": None,
              "publish_ts": None, "backend": None, "model": None, "synthetic": None,
              "parts": [{}]}  # fmt: skip
    with pytest.raises(wire.WireError, match=r"parts\[0\] has no name"):
        wire.decode([b"det/x", json.dumps(header).encode(), b""])
