"""stages.frame_wire: Frames survive the wire, and every malformed message is a FrameWireError.

References: the raw payload must round-trip bit-exactly; the JPEG payload must decode to
exactly what cv2.imdecode makes of the same bytes, and stay close to the source frame.
"""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.assets import asset_path
from pipeline.errors import NpucamError
from pipeline.messages import Frame
from stages.frame_wire import FrameWireError, decode_frame, encode_frame


@pytest.fixture(scope="module")
def bikes_frame() -> Frame:
    cap = cv2.VideoCapture(str(asset_path("bikes.mp4")))
    ok, image = cap.read()
    cap.release()
    assert ok
    return Frame("bikes", 7, 1_700_000_000_000_000_000, 1_700_000_000_500_000_000, image, "file:x")


def _header(parts: list[bytes]) -> dict:
    return json.loads(parts[0])


def _with(parts: list[bytes], **changes) -> list[bytes]:
    header = _header(parts)
    for key, value in changes.items():
        if value is KeyError:
            del header[key]
        else:
            header[key] = value
    return [json.dumps(header).encode(), parts[1]]


def test_raw_round_trip_is_bit_exact_and_keeps_every_field(bikes_frame):
    parts = encode_frame(bikes_frame, "raw")
    assert len(parts) == 2 and len(parts[1]) == 272 * 640 * 3
    got = decode_frame(parts)
    assert (got.camera, got.seq, got.capture_ts_ns, got.deadline_ns, got.source) == (
        "bikes",
        7,
        1_700_000_000_000_000_000,
        1_700_000_000_500_000_000,
        "file:x",
    )
    assert got.image.dtype == np.uint8 and got.image.flags.writeable
    np.testing.assert_array_equal(got.image, bikes_frame.image)


def test_header_has_the_documented_fields(bikes_frame):
    header = _header(encode_frame(bikes_frame, "jpeg"))
    assert header == {
        "v": 1,
        "camera": "bikes",
        "seq": 7,
        "capture_ts_ns": 1_700_000_000_000_000_000,
        "deadline_ns": 1_700_000_000_500_000_000,
        "source": "file:x",
        "encoding": "jpeg",
        "shape": [272, 640, 3],
        "dtype": "uint8",
    }


def test_jpeg_round_trip_matches_cv2_imdecode_and_the_source(bikes_frame):
    parts = encode_frame(bikes_frame, "jpeg", quality=90)
    got = decode_frame(parts)
    reference = cv2.imdecode(np.frombuffer(parts[1], np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(got.image, reference)
    # JPEG at quality 90 on natural video: PSNR well above 30 dB.
    mse = np.mean((got.image.astype(np.float64) - bikes_frame.image) ** 2)
    assert 10 * np.log10(255**2 / mse) > 30
    assert len(parts[1]) < bikes_frame.image.nbytes / 4


def test_greyscale_jpeg_payload_decodes_to_three_channels(bikes_frame):
    grey = cv2.cvtColor(bikes_frame.image, cv2.COLOR_BGR2GRAY)
    parts = encode_frame(bikes_frame, "jpeg")
    parts[1] = cv2.imencode(".jpg", grey)[1].tobytes()
    got = decode_frame(parts)
    assert got.image.shape == (272, 640, 3)
    np.testing.assert_array_equal(got.image[..., 0], got.image[..., 2])


@pytest.mark.parametrize(
    ("image", "fmt", "quality", "match"),
    [
        (np.zeros((4, 4, 3), np.float32), "raw", 90, "uint8"),
        (np.zeros((4, 4), np.uint8), "raw", 90, "uint8"),
        (np.zeros((4, 4, 4), np.uint8), "raw", 90, "shape"),
        (np.zeros((4, 4, 3), np.uint8), "png", 90, "encoding"),
        (np.zeros((4, 4, 3), np.uint8), "jpeg", 0, "quality"),
    ],
)
def test_encode_rejects_what_the_wire_cannot_carry(image, fmt, quality, match):
    with pytest.raises(FrameWireError, match=match):
        encode_frame(Frame("c", 0, 0, 0, image), fmt, quality)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda p: p[:1], "2 parts"),
        (lambda p: [*p, b""], "2 parts"),
        (lambda p: [b"{not json", p[1]], "not UTF-8 JSON"),
        (lambda p: [b"\xff\xfe", p[1]], "not UTF-8 JSON"),
        (lambda p: [b"[1, 2]", p[1]], "JSON object"),
        (lambda p: ["text", p[1]], "bytes"),
        (lambda p: _with(p, v=2), "version"),
        (lambda p: _with(p, v=KeyError), "missing field 'v'"),
        (lambda p: _with(p, camera=KeyError), "missing field 'camera'"),
        (lambda p: _with(p, camera=3), "camera: expected str"),
        (lambda p: _with(p, seq=True), "seq: expected int, got bool"),
        (lambda p: _with(p, seq=-1), "seq: must be >= 0"),
        (lambda p: _with(p, seq=1.5), "seq: expected int"),
        (lambda p: _with(p, capture_ts_ns="now"), "capture_ts_ns: expected int"),
        (lambda p: _with(p, deadline_ns=KeyError), "deadline_ns"),
        (lambda p: _with(p, source=None), "source: expected str"),
        (lambda p: _with(p, encoding="png"), "encoding"),
        (lambda p: _with(p, dtype="float32"), "dtype"),
        (lambda p: _with(p, shape=[16, 16]), "shape"),
        (lambda p: _with(p, shape=[16, 16, 4]), "shape"),
        (lambda p: _with(p, shape=[0, 16, 3]), "shape"),
        (lambda p: _with(p, shape=[100000, 100000, 3]), "shape"),
        (lambda p: _with(p, shape="16x16x3"), "shape: expected list"),
        (lambda p: _with(p, shape=[16.0, 16, 3]), "shape"),
        (lambda p: [p[0], p[1][:-1]], "767 bytes, shape .* needs 768"),
        (lambda p: _with(p, encoding="jpeg"), "not a JPEG"),
    ],
)
def test_malformed_raw_messages_name_what_is_wrong(mutate, match):
    image = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    parts = encode_frame(Frame("cam", 1, 10, 20, image), "raw")
    with pytest.raises(FrameWireError, match=match):
        decode_frame(mutate(parts))


def test_malformed_jpeg_payloads_are_rejected(bikes_frame):
    parts = encode_frame(bikes_frame, "jpeg")
    with pytest.raises(FrameWireError, match="header shape says 100x640"):
        decode_frame(_with(parts, shape=[100, 640, 3]))
    with pytest.raises(FrameWireError, match="could not be decoded"):
        decode_frame([parts[0], parts[1][: len(parts[1]) // 2]])
    with pytest.raises(FrameWireError, match="not a JPEG"):
        decode_frame([parts[0], b"\xff\xd8" + b"\x00" * 64])


def test_jpeg_declaring_a_huge_size_is_rejected_before_decoding(bikes_frame):
    parts = encode_frame(bikes_frame, "jpeg")
    payload = bytearray(parts[1])
    sof = payload.index(b"\xff\xc0")
    payload[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") + (60000).to_bytes(2, "big")
    with pytest.raises(FrameWireError, match="JPEG is 60000x60000"):
        decode_frame([parts[0], bytes(payload)])


def test_frame_wire_error_is_an_npucam_error():
    assert issubclass(FrameWireError, NpucamError)


def _decode_or_wire_error(parts) -> None:
    try:
        frame = decode_frame(parts)
    except FrameWireError:
        return
    assert frame.image.dtype == np.uint8 and frame.image.ndim == 3


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=4))
def test_arbitrary_bytes_raise_only_frame_wire_error(parts):
    _decode_or_wire_error(parts)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(
        [
            "v",
            "camera",
            "seq",
            "capture_ts_ns",
            "deadline_ns",
            "source",
            "encoding",
            "shape",
            "dtype",
        ]
    ),
    json_values,
    st.sampled_from(["raw", "jpeg"]),
    st.binary(max_size=64),
)
def test_any_field_value_or_payload_raises_only_frame_wire_error(key, value, encoding, junk):
    image = np.full((8, 8, 3), 77, np.uint8)
    parts = encode_frame(Frame("cam", 1, 10, 20, image), encoding)
    _decode_or_wire_error(_with(parts, **{key: value}))
    _decode_or_wire_error([parts[0], junk])
    _decode_or_wire_error([parts[0], bytes(parts[1][: len(junk)]) + junk])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8))
def test_corrupted_jpeg_bytes_raise_only_frame_wire_error(flips):
    image = cv2.resize(np.arange(256, dtype=np.uint8).reshape(16, 16), (64, 48))
    image = np.dstack([image, image[::-1], image[:, ::-1]])
    parts = encode_frame(Frame("cam", 1, 10, 20, image), "jpeg")
    payload = bytearray(parts[1])
    for index, byte in flips:
        payload[index % len(payload)] = byte
    _decode_or_wire_error([parts[0], bytes(payload)])


@pytest.mark.parametrize("source", ["p/" * 3000, "é" * 3000, "\U0001f600" * 400])
def test_encode_shortens_a_long_source_so_the_receiver_accepts_it(source):
    image = np.zeros((4, 6, 3), np.uint8)
    parts = encode_frame(Frame("cam", 0, 1, 2, image, source), "raw")
    got = decode_frame(parts)
    assert source.startswith(got.source) and 0 < len(got.source) < len(source)


def test_a_frame_over_max_pixels_is_refused_from_its_header():
    image = np.zeros((30, 40, 3), np.uint8)
    parts = encode_frame(Frame("cam", 0, 1, 2, image), "raw")
    assert decode_frame(parts, max_pixels=1200).image.shape == (30, 40, 3)
    with pytest.raises(FrameWireError, match="30x40 is 1200 pixels, over the limit of 1199"):
        decode_frame(parts, max_pixels=1199)
