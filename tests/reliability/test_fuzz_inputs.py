"""Bad input, fuzzed with hypothesis: only the project's own error types escape, and they say
where the fault is; a running pipeline keeps serving its other inputs.

- Config loader (pipeline.graph.load = load_config + check_stages, what `npucam run` and
  `validate` do): arbitrary text, mutations of a valid config, and arbitrary TOML-shaped
  structures. Only ConfigError escapes; every line of its message starts with the file and
  then a key path (or says the TOML itself is invalid).
- Gallery reader (stages.gallery): arbitrary bytes, mutated valid files and structurally
  wrong .npz files give GalleryError only; a GalleryFile whose file turns bad keeps the
  previous gallery in use.
- ZeroMQ frame input: a running pipeline whose `zmq:` camera receives valid frames mixed
  with malformed messages publishes every valid frame, counts every malformed one
  (bad_messages on the stats topic), and its other camera keeps streaming. (decode_frame on
  its own is fuzzed in tests/stages/test_frame_wire.py; the bundle reader in
  tests/npu/test_bundle.py.)
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rel_helpers import REMOTE_AND_CARD, Recorder, pushed_run, seq_gaps

from pipeline.config import ConfigError, parse_config
from pipeline.graph import check_stages, load
from pipeline.messages import Frame, now_ns
from stages.frame_wire import FrameWireError, decode_frame, encode_frame
from stages.gallery import Gallery, GalleryError, GalleryFile, decode_gallery, encode_gallery

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

VALID_CONFIG = """\
[pipeline]
drain_timeout_s = 2.0
[metrics]
stats_interval_s = 1.0
[[cameras]]
name = "card"
url = "synthetic:?width=64&height=48&fps=10"
staleness_ms = 500.0
reconnect_min_s = 0.5
[[cameras]]
name = "remote"
url = "zmq:tcp://127.0.0.1:5999"
[[stages]]
kind = "capture"
cameras = ["card", "remote"]
[[stages]]
kind = "publish"
bind = "tcp://127.0.0.1:5998"
inbox = { size = 8, policy = "drop_oldest" }
"""

TOP_LEVEL = ("pipeline", "metrics", "security", "cameras", "stages")  # the schema's sections


def check_message(exc: ConfigError, path: Path, data: dict | None) -> None:
    """Every line is `<file>: <key path>: problem`, the key path starting at a key the
    document has (or `(top level)`), or `<file>: invalid TOML: ...` when it did not parse."""
    for line in str(exc).split("\n"):
        assert line.startswith(f"{path}: "), line
        rest = line[len(f"{path}: ") :]
        if data is None:
            assert rest.startswith(("invalid TOML:", "cannot read:")), line
            continue
        key_path, sep, problem = rest.partition(": ")
        assert sep and problem, line
        assert key_path == "(top level)" or any(
            key_path == key or key_path.startswith((f"{key}.", f"{key}["))
            for key in [*data, *TOP_LEVEL]
        ), line


def load_only_config_error(text: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.toml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            data = tomllib.loads(path.read_text())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            data = None
        try:
            load(str(path))
        except ConfigError as exc:
            check_message(exc, path, data)


@FUZZ
@given(st.text(max_size=400))
def test_config_arbitrary_text_raises_only_config_error(text):
    load_only_config_error(text)


@FUZZ
@given(st.binary(max_size=200))
def test_config_arbitrary_bytes_raise_only_config_error(data):
    load_only_config_error(data)


@st.composite
def mutated_config(draw) -> str:
    """VALID_CONFIG with 1-4 random deletions, insertions or replacements."""
    text = VALID_CONFIG
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 12))
        insert = draw(
            st.one_of(
                st.text(max_size=8),
                st.sampled_from(
                    ['"', "[", "]", "=", "\n", "-1", "0", "1e999", "nan", "true", "{", "}", ","]
                ),
            )
        )
        text = text[:at] + insert + text[at + cut :]
    return text


@FUZZ
@given(mutated_config())
def test_config_mutated_valid_file_raises_only_config_error(text):
    load_only_config_error(text)


KEYS = [
    "pipeline", "metrics", "security", "cameras", "stages", "kind", "name", "to", "inbox",
    "size", "policy", "drop_stale", "url", "loop", "realtime", "fps", "staleness_ms",
    "stall_timeout_s", "reconnect_min_s", "reconnect_max_s", "end", "drain_timeout_s",
    "stats_interval_s", "prometheus", "bind", "connect", "sndhwm", "wait_for_subscribers",
    "format", "quality", "cameras", "server_secret_key", "authorized_clients", "x",
]  # fmt: skip
KEY_TEXT = st.text(max_size=6)
SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["capture", "publish", "zmq_push", "block", "latest", "drop_oldest",
                     "synthetic:", "zmq:tcp://127.0.0.1:1", "a", "tcp://127.0.0.1:*", "stop",
                     "engine_stages:Collect", "no.such.module:Stage", "pipeline.graph:Outbox"]),
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), KEY_TEXT), inner, max_size=4),
    ),
    max_leaves=12,
)
TABLE = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6)


@st.composite
def config_structure(draw) -> dict:
    data = draw(st.dictionaries(st.sampled_from(KEYS[:5]), VALUES, max_size=3))
    if draw(st.booleans()):
        data["cameras"] = draw(st.lists(TABLE, max_size=3))
    if draw(st.booleans()):
        data["stages"] = draw(st.lists(TABLE, max_size=3))
    return data


@FUZZ
@given(config_structure())
def test_config_arbitrary_structure_raises_only_config_error(data):
    path = Path(tempfile.gettempdir()) / "npucam-fuzz" / "structure.toml"
    try:
        check_stages(parse_config(data, path))
    except ConfigError as exc:
        check_message(exc, path, data)


def test_config_key_with_a_line_break_keeps_one_line_per_problem():
    path = Path("x.toml")
    with pytest.raises(ConfigError) as info:
        parse_config({"stages": [{"kind": "capture"}], "pipeline": {"a\nb": 1}}, path)
    check_message(info.value, path, {"pipeline": {}})


# ---- gallery -------------------------------------------------------------------------------


def small_gallery(seed: int = 0) -> Gallery:
    rng = np.random.default_rng(seed)
    g = Gallery.empty(8, "adaface-test")
    for name in ("ada", "bo"):
        g = g.add(name, rng.standard_normal((2, 8)).astype(np.float32))
    return g


VALID_GALLERY = encode_gallery(small_gallery())


def decode_only_gallery_error(data: bytes) -> None:
    try:
        g = decode_gallery(data, "fuzz.npz")
    except GalleryError as exc:
        assert "fuzz.npz" in str(exc)
    else:  # what decodes is a usable gallery
        assert g.embeddings.shape == (len(g.names), g.embed_dim)


@FUZZ
@given(st.binary(max_size=600))
def test_gallery_arbitrary_bytes_raise_only_gallery_error(data):
    decode_only_gallery_error(data)


@FUZZ
@given(st.data())
def test_gallery_mutated_valid_file_raises_only_gallery_error(data):
    raw = bytearray(VALID_GALLERY)
    for _ in range(data.draw(st.integers(1, 6))):
        how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, len(raw) - 1))
        if how == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del raw[at : at + data.draw(st.integers(1, 64))]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        if not raw:
            break
    decode_only_gallery_error(bytes(raw))


ARRAYS = st.one_of(
    st.just(np.zeros((2, 8), np.float32)),
    st.just(np.ones((2, 8), np.float64)),
    st.just(np.full((1, 8), np.nan, np.float32)),
    st.just(np.zeros((0, 0), np.float32)),
    st.just(np.array(["a", "b"])),
    st.just(np.array([1, 2], np.int64)),
    st.just(np.zeros(3, np.uint8)),
    st.just(np.frombuffer(b'{"format":"npucam-face-gallery","version":1}', np.uint8)),
    st.builds(lambda s: np.frombuffer(s.encode(), np.uint8), st.text(max_size=40)),
    st.builds(
        lambda d: np.frombuffer(json.dumps(d).encode(), np.uint8),
        st.dictionaries(
            st.sampled_from(["format", "version", "embed_dim", "model", "x"]),
            st.one_of(st.integers(-2, 600), st.text(max_size=5), st.none(),
                      st.just("npucam-face-gallery")),
        ),
    ),
)  # fmt: skip


@FUZZ
@given(st.dictionaries(st.sampled_from(["names", "embeddings", "meta", "extra"]), ARRAYS))
def test_gallery_structurally_wrong_npz_raises_only_gallery_error(arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    decode_only_gallery_error(buf.getvalue())


@FUZZ
@given(st.binary(min_size=1, max_size=300))
def test_gallery_file_keeps_the_previous_gallery_when_the_file_turns_bad(tmp_path, bad):
    path = tmp_path / "gallery.npz"
    path.write_bytes(VALID_GALLERY)
    gallery_file = GalleryFile(path, embed_dim=8)
    before = gallery_file.current
    path.write_bytes(bad + b"\0" * (len(VALID_GALLERY) + 1))  # a different size: a new stamp
    assert gallery_file.reload_if_changed() is False
    assert gallery_file.current is before
    assert isinstance(gallery_file.last_error, GalleryError)
    assert str(path) in str(gallery_file.last_error)
    path.write_bytes(encode_gallery(small_gallery(1)))  # a good file again is picked up
    assert gallery_file.reload_if_changed() is True
    assert gallery_file.current is not before and gallery_file.last_error is None


# ---- a zmq camera fed malformed and valid messages, in a running pipeline -------------------


def malformed_messages(rng: random.Random, valid: list[bytes]) -> list[list[bytes]]:
    """Messages a broken or hostile sender might PUSH: wrong part counts, non-JSON or
    wrong-typed headers, payloads that do not match the header, truncated or bit-flipped
    frames."""
    header = json.loads(valid[0])
    out = [
        [b""],
        [valid[0]],
        [valid[0], valid[1], b"extra"],
        [b"\xff\xfe", valid[1]],
        [b"[1, 2]", valid[1]],
        [json.dumps({**header, "v": 2}).encode(), valid[1]],
        [json.dumps({**header, "shape": [48, 64, 4]}).encode(), valid[1]],
        [json.dumps({**header, "shape": [10**6, 10**6, 3]}).encode(), valid[1]],
        [json.dumps({**header, "seq": True}).encode(), valid[1]],
        [json.dumps({**header, "encoding": "png"}).encode(), valid[1]],
        [json.dumps({**header, "encoding": "raw"}).encode(), valid[1]],
        [valid[0], valid[1][: len(valid[1]) // 2]],
        [valid[0], b"\xff\xd8" + bytes(rng.randrange(256) for _ in range(300))],
    ]
    for _ in range(20):
        payload = bytearray(valid[1])
        for _ in range(rng.randrange(1, 8)):
            payload[rng.randrange(len(payload))] ^= rng.randrange(1, 256)
        head = bytearray(valid[0])
        head[rng.randrange(len(head))] = rng.randrange(256)
        out.append([bytes(head), valid[1]] if rng.random() < 0.5 else [valid[0], bytes(payload)])
    return out


def decodes(parts: list[bytes]) -> bool:
    try:
        decode_frame(parts)
    except FrameWireError:
        return False
    return True


def mixed_stream() -> tuple[list[tuple[bool, list[bytes]]], int, int]:
    """(stream, how many of it decode, how many do not): malformed messages with a valid
    frame after every second one; (True, msg) for a frame valid by construction."""
    rng = random.Random(8)
    image = np.zeros((48, 64, 3), np.uint8)
    image[:, :32] = (0, 128, 255)
    valid = encode_frame(Frame("cam0", 0, now_ns(), now_ns() + 10**9, image, "test"), "jpeg")
    bad = malformed_messages(rng, valid)
    # Every third message is a valid frame; malformed ones between and around them.
    stream: list[tuple[bool, list[bytes]]] = []
    for i, msg in enumerate(bad):
        stream.append((False, msg))
        if i % 2:
            stream.append((True, encode_frame(
                Frame("cam0", i, now_ns(), now_ns() + 10**9, image, "test"), "jpeg")))  # fmt: skip
    # A bit flip can leave a message valid (a JPEG scan still decodes, a header byte inside
    # `source` changes); the wire decoder, fuzzed on its own, decides which ones are.
    n_valid = sum(decodes(msg) for _, msg in stream)
    return stream, n_valid, len(stream) - n_valid


def remote_counts(rec: Recorder) -> tuple[int, int]:
    """The remote camera's (frames, bad_messages) in the newest stats message."""
    stats = rec.stats()
    remote = stats[-1].header["stats"]["cameras"].get("remote", {}) if stats else {}
    return remote.get("frames", 0), remote.get("bad_messages", 0)


async def serve_stream(path, endpoint: str, stream: list[list[bytes] | None], n_valid: int):
    """Run the pipeline and PUSH `stream` to its remote camera, a message every 10 ms or more
    (None: the slot left empty), then wait until every message is published or counted and
    the card camera has published a frame after that. (exit code, recorder, the cameras of
    the last stats, the recorder's clock (ns) when sending began and when it ended)."""
    n_bad = sum(msg is not None for msg in stream) - n_valid
    async with pushed_run(path, endpoint) as run:
        rec = run.rec
        await rec.wait_for(lambda: len(rec.frames("card")) >= 5, 10, "card streaming")
        t0 = now_ns()
        for msg in stream:
            if msg is not None:
                await asyncio.to_thread(run.push.send_multipart, msg)  # blocks at the HWM
            await asyncio.sleep(0.01)
        t_sent = now_ns()
        # hang guards: each wait returns once its condition holds
        await rec.wait_for(
            lambda: len(rec.frames("remote")) >= n_valid, 20, "every valid remote frame"
        )
        await rec.wait_for(
            lambda: remote_counts(rec)[1] >= n_bad, 20, "every malformed message counted"
        )
        done = now_ns()
        await rec.wait_for(
            lambda: rec.frames("card")[-1].received_ns > done, 20, "card streaming after it"
        )
        last = rec.stats()[-1].header["stats"]["cameras"]
    return run.code, rec, last, (t0, t_sent)


def test_zmq_camera_serves_valid_frames_among_malformed_ones_and_others_keep_flowing(
    write_config, free_port
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = write_config(REMOTE_AND_CARD.format(endpoint=endpoint))
    stream, n_valid, n_bad = mixed_stream()
    assert n_valid >= sum(ok for ok, _ in stream) and n_bad >= 20

    code, rec, last, (t0, t_sent) = asyncio.run(
        serve_stream(path, endpoint, [msg for _, msg in stream], n_valid)
    )
    assert code == 0
    remote = rec.frames("remote")
    # each keeps the seq its sender gave it (a bit flip may have changed a digit)
    assert [s.header["seq"] for s in remote] == [
        decode_frame(msg).seq for _, msg in stream if decodes(msg)
    ]
    assert all((s.header["width"], s.header["height"]) == (64, 48) for s in remote)
    assert last["remote"]["bad_messages"] == n_bad
    assert last["remote"]["frames"] == n_valid
    assert last["remote"]["reconnects"] == 0
    assert last["remote"]["health"] == "online"
    assert last["card"]["health"] == "online"
    # The other camera kept flowing: it published while the malformed messages came and after
    # them (serve_stream waited for that), every frame of it in order and none lost (the
    # publish inbox blocks). Its rate and longest gap against a run without the malformed
    # messages: the slow test below.
    card = rec.frames("card")
    assert any(t0 <= s.received_ns <= t_sent for s in card)
    seqs = [s.header["seq"] for s in card]
    assert seqs == sorted(seqs) and seq_gaps(seqs) == 0, seqs


@pytest.mark.slow  # the other camera's rate and gaps on the wall clock: never in the default run
def test_malformed_messages_on_a_zmq_camera_keep_the_other_camera_near_its_clean_rate(
    write_config, free_port
):
    # Two runs back to back, sharing the host's load: the control sends the stream's valid
    # frames only (the malformed messages' slots left empty, so both send for about as long),
    # then the whole stream. The card camera's frames while the stream is sent: at least half
    # the control's rate, and no silence more than three times the control's longest.
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = write_config(REMOTE_AND_CARD.format(endpoint=endpoint))
    stream, n_valid, _ = mixed_stream()
    runs = {
        "control": [msg if decodes(msg) else None for _, msg in stream],
        "malformed": [msg for _, msg in stream],
    }
    rate, gap = {}, {}
    for name, sent in runs.items():
        code, rec, _, (t0, t1) = asyncio.run(serve_stream(path, endpoint, sent, n_valid))
        assert code == 0
        card = [s.received_ns for s in rec.frames("card") if t0 <= s.received_ns <= t1]
        edges = [t0, *card, t1]
        rate[name] = len(card) / ((t1 - t0) / 1e9)
        gap[name] = max(b - a for a, b in zip(edges, edges[1:], strict=False)) / 1e9
    print(
        f"card while the stream is sent, control / malformed: {rate['control']:.1f} / "
        f"{rate['malformed']:.1f} a second, longest gap {gap['control']:.3f} / "
        f"{gap['malformed']:.3f} s"
    )
    assert rate["malformed"] >= 0.5 * rate["control"], rate
    assert gap["malformed"] <= 3 * gap["control"], gap


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


# ---- the external detector's box messages (stages.detect, person = "zmq") -------------------

BOX_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.sampled_from(["cam", "other", ""]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.sampled_from(["camera", "boxes", "scores", "seq", "ts", "x"]), inner, max_size=5
        ),
    ),
    max_leaves=20,
)


def decode_only_box_error(raw: bytes) -> None:
    from stages.box_receiver import BoxMessageError, decode_box_message

    try:
        got = decode_box_message(raw, ["cam", "other"])
    except BoxMessageError:
        return
    assert got.camera in ("cam", "other")
    assert got.boxes.dtype == np.float32 and got.boxes.shape == (len(got.scores), 4)


@FUZZ
@given(BOX_JSON)
def test_box_message_arbitrary_json_raises_only_box_message_error(value):
    decode_only_box_error(json.dumps(value).encode())


@FUZZ
@given(st.binary(max_size=200))
def test_box_message_arbitrary_bytes_raise_only_box_message_error(raw):
    decode_only_box_error(raw)


@FUZZ
@given(
    st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=4, max_size=4), max_size=4),
    st.data(),
)
def test_box_message_well_formed_ones_decode_to_their_boxes(boxes, data):
    boxes = [[x, y, abs(w) + 1, abs(h) + 1] for x, y, w, h in boxes]
    scores = data.draw(st.lists(st.floats(0, 1), min_size=len(boxes), max_size=len(boxes)))
    from stages.box_receiver import decode_box_message

    raw = json.dumps({"camera": "cam", "boxes": boxes, "scores": scores}).encode()
    got = decode_box_message(raw)
    np.testing.assert_array_equal(got.boxes, np.array(boxes, np.float32).reshape(-1, 4))
    np.testing.assert_array_equal(got.scores, np.array(scores, np.float32))


HOSTILE_BOX_MESSAGES = {
    "int beyond float": b'{"camera": "cam", "boxes": [[1, 2, 1' + b"0" * 400 + b", 4]]}",
    "nested 100000 deep": b"[" * 100_000,
}


@pytest.mark.parametrize("name", list(HOSTILE_BOX_MESSAGES))
def test_box_message_hostile_input_raises_only_box_message_error(name):
    decode_only_box_error(HOSTILE_BOX_MESSAGES[name])


def test_box_message_values_beyond_float32_are_refused():
    from stages.box_receiver import BoxMessageError, decode_box_message

    with pytest.raises(BoxMessageError):
        decode_box_message(b'{"camera": "cam", "boxes": [[1, 2, 1e39, 4]]}')


def test_box_receiver_keeps_serving_after_a_hostile_message(free_port):
    from stages.box_receiver import BoxReceiver

    endpoint = f"tcp://127.0.0.1:{free_port}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    receiver = BoxReceiver(endpoint, ["cam"])
    try:
        good = json.dumps({"camera": "cam", "boxes": [[1, 2, 3, 4]]}).encode()
        deadline = time.monotonic() + 5
        while receiver.received == 0 and time.monotonic() < deadline:  # slow joiner
            pub.send(good)
            time.sleep(0.02)
        assert receiver.received > 0
        pub.send(HOSTILE_BOX_MESSAGES["int beyond float"])
        pub.send(b"not json")
        before = receiver.received
        for _ in range(10):
            pub.send(good)
            time.sleep(0.02)
        deadline = time.monotonic() + 2
        while receiver.received < before + 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert receiver.received == before + 10
        assert receiver.malformed >= 1
    finally:
        receiver.close()
        pub.close(0)
        ctx.term()
