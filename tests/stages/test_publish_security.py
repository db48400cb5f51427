"""CURVE on the publish and frame sockets, end to end on loopback: only authorised peers get
anything, an eavesdropper sees no plaintext, rogue frame pushers and pullers get nowhere,
and `npucam subscribe` works with its key flags. Clients here set pyzmq's CURVE options
themselves, independently of pipeline.security."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
import zmq.auth
from engine_stages import receive, start, until

from pipeline import security, wire
from stages.meta import contract

REPO = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def keys(tmp_path):
    """server/client/rogue/thief pairs; allowed/ lists only the client's public key.
    keys[name] = (public file, secret file, public Z85, secret Z85)."""
    d = tmp_path / "keys"
    out = {"dir": d}
    for name in ("server", "client", "rogue", "thief"):
        public, secret = security.generate_keys(name, d)
        out[name] = (public, secret, *zmq.auth.load_certificate(secret))
    (d / "allowed").mkdir()
    (d / "allowed" / "client.key").write_bytes(out["client"][0].read_bytes())
    return out


def _secure_sub(ctx, endpoint: str, server_public: bytes | None, pair=None):
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    if pair is not None:
        sub.curve_publickey, sub.curve_secretkey = pair
        sub.curve_serverkey = server_public
    sub.connect(endpoint)
    return sub


def _publish_config(write_config, keys, secure: bool = True) -> Path:
    table = f"""
        [security]
        server_secret_key = "{keys["server"][1]}"
        authorized_clients = "keys/allowed"
        """
    return write_config(
        f"""
        {table if secure else ""}
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "card"
        url = "synthetic:?width=64&height=48&fps=50"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        """,
        name="pub.toml",
    )


def test_only_an_authorised_curve_subscriber_receives(write_config, keys):
    path = _publish_config(write_config, keys)
    server_public = keys["server"][2]

    async def main():
        pipeline, task = await start(path, duration=2.0)
        publish = pipeline.stages["publish"]
        await asyncio.wait_for(publish.bound.wait(), 5)
        ctx = zmq.asyncio.Context()
        subs = {
            "plain": _secure_sub(ctx, publish.endpoint, None),
            "unknown key": _secure_sub(ctx, publish.endpoint, server_public, keys["rogue"][2:]),
            # An authorised client that trusts the wrong server key never talks to this one.
            "wrong server": _secure_sub(
                ctx, publish.endpoint, keys["rogue"][2], keys["client"][2:]
            ),
            "authorised": _secure_sub(ctx, publish.endpoint, server_public, keys["client"][2:]),
        }
        got = await asyncio.gather(*(receive(s, until_idle_s=1.0) for s in subs.values()))
        for s in subs.values():
            s.close()
        ctx.term()
        return await task, dict(zip(subs, got, strict=True)), publish.guard.rejected

    code, got, rejected = asyncio.run(main())
    assert code == 0
    messages = [wire.decode(m) for m in got.pop("authorised")]
    det = [m for m in messages if m.topic == "det/card"]
    assert len(det) >= 3 and {m.topic for m in messages} == {"meta", "det/card", "stats"}
    assert got == {"plain": [], "unknown key": [], "wrong server": []}
    assert rejected >= 1  # the unknown key reached the ZAP allow-list and was refused


class _Tap:
    """A loopback TCP forwarder that records what the server sends: an eavesdropper. With
    tamper, each server -> client chunk goes through tamper(chunk, bytes seen before it)."""

    def __init__(self, target_port: int, tamper=None) -> None:
        self.target_port = target_port
        self.tamper = tamper
        self.seen = bytearray()
        self.connections = 0
        self.connected_at_ns: list[int] = []  # wall clock of each client connection
        self.closing = False  # set before the test closes its own client
        self.server_closed = False
        self.dropped_by_client = False  # the client hung up first, while the test listened
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _client(self, reader, writer) -> None:
        self.connections += 1
        self.connected_at_ns.append(time.time_ns())
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except ConnectionError:  # the server has gone (end of the run)
            writer.close()
            return

        async def pipe(src, dst, record: bool) -> None:
            try:
                while data := await src.read(65536):
                    if record:
                        if self.tamper is not None:
                            data = self.tamper(data, len(self.seen))
                        self.seen += data
                    dst.write(data)
                    await dst.drain()
                if record:
                    self.server_closed = True
                elif not (self.closing or self.server_closed):
                    self.dropped_by_client = True
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("curve", [True, False])
def test_an_eavesdropper_sees_plaintext_only_without_curve(write_config, keys, curve):
    path = _publish_config(write_config, keys, secure=curve)

    async def main():
        pipeline, task = await start(path, duration=1.5)
        publish = pipeline.stages["publish"]
        await asyncio.wait_for(publish.bound.wait(), 5)
        tap = _Tap(int(publish.endpoint.rsplit(":", 1)[1]))
        await tap.start()
        ctx = zmq.asyncio.Context()
        pair = keys["client"][2:] if curve else None
        sub = _secure_sub(ctx, f"tcp://127.0.0.1:{tap.port}", keys["server"][2], pair)
        got = await receive(sub, until_idle_s=1.0)
        sub.close()
        ctx.term()
        tap.close()
        return await task, got, bytes(tap.seen)

    code, got, seen = asyncio.run(main())
    assert code == 0 and len(got) >= 3  # the subscriber got the messages through the tap
    header = b'"camera":"card"'
    assert header in next(m for m in got if m[0] == b"det/card")[1]
    assert (header in seen) is not curve


class _FlipOnce:
    """Flips one bit of the first server -> client byte past `at` (after the handshake)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.done = False

    def __call__(self, chunk: bytes, offset: int) -> bytes:
        if self.done or offset + len(chunk) <= self.at:
            return chunk
        self.done = True
        i = max(0, self.at - offset)
        return chunk[:i] + bytes([chunk[i] ^ 0x01]) + chunk[i + 1 :]


def _forge_camera(chunk: bytes, offset: int) -> bytes:
    """Rewrites the camera name in plaintext headers: a forgery only plain traffic allows."""
    return chunk.replace(b'"camera":"card"', b'"camera":"bard"')


@pytest.mark.parametrize("curve", [True, False])
def test_a_tamperer_in_the_middle_is_detected_only_with_curve(write_config, keys, curve):
    path = _publish_config(write_config, keys, secure=curve)
    # past the meta message every subscriber gets first: the flip lands in det/ traffic
    tamper = _FlipOnce(at=len(json.dumps(contract())) + 4096) if curve else _forge_camera

    async def main():
        pipeline, task = await start(path, duration=2.5)
        publish = pipeline.stages["publish"]
        await asyncio.wait_for(publish.bound.wait(), 5)
        tap = _Tap(int(publish.endpoint.rsplit(":", 1)[1]), tamper)
        await tap.start()
        ctx = zmq.asyncio.Context()
        sub = _secure_sub(
            ctx,
            f"tcp://127.0.0.1:{tap.port}",
            keys["server"][2],
            keys["client"][2:] if curve else None,
        )
        got = await receive(sub, until_idle_s=1.0)
        tap.closing = True
        sub.close()
        ctx.term()
        tap.close()
        return await task, got, tap

    code, got, tap = asyncio.run(main())
    assert code == 0
    cameras = [wire.decode(m).header["camera"] for m in got if m[0] not in (b"stats", b"meta")]
    if curve:
        # The altered ciphertext fails its MAC: the subscriber's libzmq hangs up (a protocol
        # error; 4.3.5 does not reconnect after one). Nothing altered is delivered.
        assert tamper.done and tap.dropped_by_client
        assert cameras and set(cameras) == {"card"}
    else:
        assert len(cameras) >= 3 and set(cameras) == {"bard"}
        assert not tap.dropped_by_client


def _push_config(write_config, name: str, port: int, security_table: str) -> Path:
    return write_config(
        f"""
        {security_table}
        [[cameras]]
        name = "{name}"
        url = "synthetic:?width=64&height=48&fps=50"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "zmq_push"
        bind = "tcp://127.0.0.1:{port}"
        format = "raw"
        """,
        name=f"{name}.toml",
    )


def test_frames_arrive_only_from_the_authorised_pusher_and_only_at_authorised_cameras(
    write_config, keys
):
    ports = {"good": _port(), "rogue": _port(), "plain": _port()}
    allowed = 'authorized_clients = "keys/allowed"'
    pushers = [
        _push_config(
            write_config,
            "good",
            ports["good"],
            f'[security]\nserver_secret_key = "{keys["server"][1]}"\n{allowed}',
        ),
        # Impersonates the capture host: right port, right allow-list, its own server key.
        _push_config(
            write_config,
            "rogue",
            ports["rogue"],
            f'[security]\nserver_secret_key = "{keys["rogue"][1]}"\n{allowed}',
        ),
        _push_config(write_config, "plain", ports["plain"], ""),
    ]
    infer = write_config(
        f"""
        [security]
        server_public_key = "{keys["server"][0]}"
        client_secret_key = "{keys["client"][1]}"
        [[cameras]]
        name = "good"
        url = "zmq:tcp://127.0.0.1:{ports["good"]}"
        [[cameras]]
        name = "rogue"
        url = "zmq:tcp://127.0.0.1:{ports["rogue"]}"
        [[cameras]]
        name = "plain"
        url = "zmq:tcp://127.0.0.1:{ports["plain"]}"
        [[cameras]]
        name = "thief"
        url = "zmq:tcp://127.0.0.1:{ports["good"]}"
        security = {{ client_secret_key = "{keys["thief"][1]}" }}
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "sink"
        kind = "engine_stages:Collect"
        """,
        name="infer.toml",
    )

    async def main():
        senders = [await start(p, duration=20.0) for p in pushers]
        receiver, recv_task = await start(infer, duration=20.0)
        sink = receiver.stages["sink"]

        def good() -> int:
            return sum(f.camera == "good" for f in sink.items)

        # Until 10 good frames arrived (however loaded the machine), then 10 more, during
        # which the others, connected as early and pushing as fast, had every chance too.
        await until(lambda: good() >= 10, "10 good frames")
        await until(lambda: good() >= 20, "10 more good frames")
        for pipeline, _ in [*senders, (receiver, recv_task)]:
            pipeline.stop()
        codes = [await t for _, t in senders] + [await recv_task]
        return codes, senders[0][0], receiver

    codes, good_sender, receiver = asyncio.run(main())
    assert codes == [0, 0, 0, 0]
    by_camera: dict[str, int] = {}
    for frame in receiver.stages["sink"].items:
        by_camera[frame.camera] = by_camera.get(frame.camera, 0) + 1
    assert by_camera.get("good", 0) >= 20
    assert set(by_camera) == {"good"}  # nothing from the rogue or plain pusher, nor to the thief
    assert good_sender.stages["zmq_push"].guard.rejected >= 1  # the thief's key was refused


def _subscribe(endpoint: str, *flags: str):
    return asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "subscribe",
        endpoint,
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )


def test_npucam_subscribe_with_client_key_flags(write_config, keys):
    path = _publish_config(write_config, keys)
    server_key = str(keys["server"][0])

    async def main():
        # runs until the subscribers are done (stopped below): three `npucam subscribe`
        # processes starting on a loaded host took longer than a fixed 15 s run
        pipeline, task = await start(path, duration=120.0)
        publish = pipeline.stages["publish"]
        await asyncio.wait_for(publish.bound.wait(), 5)
        ep = publish.endpoint
        good = await _subscribe(
            ep, "--server-key", server_key, "--client-key", str(keys["client"][1]), "--count", "3",
            "--topic", "det/",
        )  # fmt: skip
        bad = await _subscribe(
            ep, "--server-key", server_key, "--client-key", str(keys["rogue"][1]), "--timeout", "1"
        )
        half = await _subscribe(ep, "--server-key", server_key, "--timeout", "1")
        try:
            results = [await asyncio.wait_for(p.communicate(), 30) + (p.returncode,)
                       for p in (good, bad, half)]  # fmt: skip
        finally:  # a subscriber that outlived its wait must not outlive the test
            for p in (good, bad, half):
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        pipeline.stop()
        return await task, results

    code, (good, bad, half) = asyncio.run(main())
    assert code == 0
    out, err, rc = good
    assert rc == 0, err.decode()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert len(lines) == 3 and all(line["topic"] == "det/card" for line in lines)
    out, err, rc = bad
    assert (rc, out) == (1, b"") and b"no message for 1 s" in err
    out, err, rc = half
    assert rc == 2 and b"needs both --server-key and --client-key" in err


def test_npucam_subscribe_names_a_bad_key_file(tmp_path, keys):
    async def main():
        p = await _subscribe(
            "tcp://127.0.0.1:1",
            "--server-key",
            str(tmp_path / "nope.key"),
            "--client-key",
            str(keys["client"][0]),
        )
        out, err = await asyncio.wait_for(p.communicate(), 30)
        return p.returncode, err.decode()

    rc, err = asyncio.run(main())
    assert rc == 2
    assert f"--server-key: {tmp_path / 'nope.key'}: no such key file" in err
    assert f"--client-key: {keys['client'][0]}: holds no secret-key" in err


def test_the_secure_split_configs_work_with_make_keys(tmp_path):
    """configs/split-*-secure.toml with keys from `make keys`, on free ports: frames cross
    the CURVE hop and an authorised subscriber reads the result; the keys stay out of git."""
    import subprocess

    keys = tmp_path / "keys"
    subprocess.run(
        ["make", "-s", "-o", ".venv/.runtime", "keys", f"KEYS={keys}"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    ports = {"5571": str(_port()), "5572": str(_port()), "5560": str(_port())}
    paths = []
    for name in ("split-capture-secure.toml", "split-infer-secure.toml"):
        text = (REPO / "configs" / name).read_text()
        for old, new in ports.items():
            text = text.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
        (tmp_path / name).write_text(text)
        paths.append(tmp_path / name)
    pair = zmq.auth.load_certificate(keys / "subscriber.key_secret")
    server = zmq.auth.load_certificate(keys / "infer.key")[0]

    async def main():
        capture, capture_task = await start(paths[0], duration=3.0)
        infer, infer_task = await start(paths[1], duration=3.0)
        await asyncio.wait_for(infer.stages["publish"].bound.wait(), 5)
        ctx = zmq.asyncio.Context()
        sub = _secure_sub(ctx, f"tcp://127.0.0.1:{ports['5560']}", server, pair)
        got = await receive(sub, until_idle_s=1.5)
        sub.close()
        ctx.term()
        return await capture_task, await infer_task, got

    code_c, code_i, got = asyncio.run(main())
    assert (code_c, code_i) == (0, 0)
    topics = {wire.decode(m).topic for m in got}
    assert {"det/bikes", "det/carphone"} <= topics
    ignored = subprocess.run(
        ["git", "check-ignore", "configs/keys/capture.key_secret", "elsewhere/x.key_secret"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert ignored == ["configs/keys/capture.key_secret", "elsewhere/x.key_secret"]


def test_a_connecting_frame_pusher_is_a_curve_client(write_config, keys):
    """zmq_push with `connect`: it pins the receiver's server key and shows its client key;
    the receiver here is a plain pyzmq PULL with its own ZAP authenticator."""
    from zmq.auth.thread import ThreadAuthenticator

    from stages.frame_wire import decode_frame

    port = _port()
    path = write_config(
        f"""
        [security]
        server_public_key = "{keys["server"][0]}"
        client_secret_key = "{keys["client"][1]}"
        [[cameras]]
        name = "card"
        url = "synthetic:?width=32&height=24&fps=50"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "zmq_push"
        connect = "tcp://127.0.0.1:{port}"
        format = "raw"
        """
    )
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys["dir"] / "allowed"))
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.curve_publickey, pull.curve_secretkey = keys["server"][2:]
    pull.curve_server = True
    pull.bind(f"tcp://127.0.0.1:{port}")

    async def main():
        pipeline, task = await start(path, duration=1.0)
        return await task, pipeline

    try:
        code, pipeline = asyncio.run(main())
        frames = []
        while pull.poll(200):
            frames.append(decode_frame(pull.recv_multipart()))
    finally:
        pull.close()
        auth.stop()
        ctx.term()
    assert code == 0
    assert len(frames) >= 3 and all(f.image.shape == (24, 32, 3) for f in frames)
    assert pipeline.stages["zmq_push"].guard.curve.client_public == keys["client"][2]


def test_a_zmq_camera_recovers_after_a_tampered_frame(write_config, keys):
    """A flipped bit on the CURVE frame hop ends that connection for good in libzmq; the
    camera goes stale, reopens its socket after stall_timeout_s and frames flow again."""
    port = _port()
    sender = _push_config(
        write_config,
        "card",
        port,
        f'[security]\nserver_secret_key = "{keys["server"][1]}"\n'
        'authorized_clients = "keys/allowed"',
    )
    flip = _FlipOnce(at=20_000)  # a few raw 64x48 frames after the handshake

    async def main():
        tap = _Tap(port, flip)
        await tap.start()
        receiver_config = write_config(
            f"""
            [security]
            server_public_key = "{keys["server"][0]}"
            client_secret_key = "{keys["client"][1]}"
            [[cameras]]
            name = "remote"
            url = "zmq:tcp://127.0.0.1:{tap.port}"
            stall_timeout_s = 0.4
            reconnect_min_s = 0.05
            reconnect_max_s = 0.1
            [[stages]]
            kind = "capture"
            [[stages]]
            name = "sink"
            kind = "engine_stages:Collect"
            """,
            name="receiver.toml",
        )
        push, push_task = await start(sender, duration=3.0)
        receiver, recv_task = await start(receiver_config, duration=3.0)
        codes = (await push_task, await recv_task)
        tap.closing = True
        tap.close()
        return codes, receiver, tap

    codes, receiver, tap = asyncio.run(main())
    assert codes == (0, 0)
    assert flip.done and tap.dropped_by_client and tap.connections >= 2
    frames = receiver.stages["sink"].items
    stats = receiver.stages["capture"].readers["remote"].stats()
    assert stats["reconnects"] >= 1
    # Frames arrived before the flip and, over the reopened connection, after it; all intact.
    assert len(frames) >= 5 and all(f.image.shape == (48, 64, 3) for f in frames)
    reopened = tap.connected_at_ns[1]
    assert frames[0].capture_ts_ns < reopened < frames[-1].capture_ts_ns
