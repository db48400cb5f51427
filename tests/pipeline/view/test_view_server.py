"""The view server: what a page receives (packed wire messages without embeddings, meta first),
subscriptions only while a page is open, the Host and Origin checks, and its limits."""

from __future__ import annotations

import asyncio
import struct

import aiohttp
import numpy as np
import pytest
import zmq
import zmq.asyncio

from pipeline import wire
from pipeline.cli import main as npucam
from pipeline.view import server as view_server
from pipeline.view.server import Page, ViewError, ViewServer, for_page, pack, parse_bind


def unpack(data: bytes) -> list[bytes]:
    (n,) = struct.unpack_from("<I", data)
    lengths = struct.unpack_from(f"<{n}I", data, 4)
    parts, offset = [], 4 * (n + 1)
    for length in lengths:
        parts.append(data[offset : offset + length])
        offset += length
    assert offset == len(data)
    return parts


def face_message() -> list[bytes]:
    header = {
        "kind": "face", "camera": "door", "seq": 7, "capture_ts": 1, "publish_ts": 2,
        "backend": "sim", "model": "adaface", "synthetic": True, "identity": None,
    }  # fmt: skip
    arrays = [
        ("box", np.arange(4, dtype=np.float32)),
        ("landmarks", np.ones((5, 2), np.float32)),
        ("embedding", np.full(512, 0.5, np.float32)),
    ]
    return [bytes(p) for p in wire.encode("face/door", header, arrays)]


def test_a_page_gets_the_message_packed_and_without_the_face_embedding():
    parts = face_message()
    relayed = wire.decode(unpack(pack(for_page(wire.decode(parts), parts))))
    assert relayed.topic == "face/door" and relayed.header["seq"] == 7
    assert set(relayed.arrays) == {"box", "landmarks"}
    np.testing.assert_array_equal(relayed.arrays["landmarks"], np.ones((5, 2), np.float32))
    det = [bytes(p) for p in wire.encode("det/door", {**wire.decode(parts).header, "kind": "det"})]
    assert for_page(wire.decode(det), det) == det  # nothing to remove: relayed as it came


@pytest.mark.parametrize(
    ("bind", "expect"),
    [
        ("127.0.0.1:8560", ("127.0.0.1", 8560)),
        ("[::1]:0", ("::1", 0)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
    ],
)
def test_bind_addresses_parse(bind, expect):
    assert parse_bind(bind) == expect


@pytest.mark.parametrize("bind", ["8560", "localhost", ":8560", "host:http", "host:70000"])
def test_a_bad_bind_is_a_clear_error(bind):
    with pytest.raises(ViewError, match="expected HOST:PORT"):
        parse_bind(bind)


def test_a_page_backlog_keeps_the_newest_and_counts_what_it_dropped():
    page = Page(ws=None)
    for i in range(view_server.PAGE_BACKLOG + 5):
        page.offer(bytes([i]))
    assert page.dropped == 5 and page.backlog[0] == bytes([5])


def test_curve_needs_both_key_flags(capsys):
    assert npucam(["view", "tcp://127.0.0.1:1", "--server-key", "x.key"]) == 2
    assert "needs both --server-key and --client-key" in capsys.readouterr().err


async def next_event(xpub) -> bytes:
    return await asyncio.wait_for(xpub.recv(), 5)


def test_the_view_relays_to_pages_and_subscribes_only_while_one_is_open():
    async def main():
        ctx = zmq.asyncio.Context()
        xpub = ctx.socket(zmq.XPUB)
        xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
        xpub.setsockopt(zmq.LINGER, 0)
        port = xpub.bind_to_random_port("tcp://127.0.0.1")
        view = ViewServer(f"tcp://127.0.0.1:{port}", host="127.0.0.1", port=0)
        await view.start()
        events = [await next_event(xpub)]  # meta, before any page
        meta = wire.encode("meta", {"kind": "meta", "camera": "", "seq": 0, "capture_ts": 5,
                                    "publish_ts": 5, "backend": "none", "model": "none",
                                    "synthetic": False, "meta": {"cameras": ["door"]}})  # fmt: skip
        await xpub.send_multipart(meta)
        await asyncio.sleep(0.2)
        got, refused = [], {}
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(view.url + "ws") as ws:
                events.append(await next_event(xpub))  # the page opened: everything
                # the relay reads in order: once the face reaches the page, the bad one is counted
                await xpub.send_multipart([b"det/door", b"not json"])
                await xpub.send_multipart(face_message())
                while len([m for m in got if isinstance(m, bytes)]) < 2:
                    msg = await asyncio.wait_for(ws.receive(), 5)
                    got.append(msg.data)
            events.append(await next_event(xpub))  # the last page closed
            async with http.get(view.url, headers={"Host": f"evil.example:{view.port}"}) as r:
                refused["foreign host"] = r.status
            try:
                async with http.ws_connect(view.url + "ws", origin="http://evil.example"):
                    pass
            except aiohttp.WSServerHandshakeError as exc:
                refused["foreign origin"] = exc.status
            async with http.get(view.url) as r:
                page = await r.text()
        malformed = view.malformed
        await view.close()
        xpub.close()
        ctx.term()
        return events, got, refused, malformed, page

    events, got, refused, malformed, page = asyncio.run(main())
    assert events == [b"\x01meta", b"\x01", b"\x00"]
    relayed = [wire.decode(unpack(m)) for m in got if isinstance(m, bytes)]
    assert [m.topic for m in relayed] == ["meta", "face/door"]  # the cached meta comes first
    assert set(relayed[1].arrays) == {"box", "landmarks"}
    assert any(isinstance(m, str) and '"view"' in m for m in got)  # the status line
    assert malformed == 1
    assert refused == {"foreign host": 403, "foreign origin": 403}
    assert "/static/view.js" in page


def test_the_view_reads_a_curve_publisher_with_the_subscribe_key_flags(write_config, tmp_path):
    """As `npucam view --server-key --client-key`: pipeline.security's client keys."""
    from engine_stages import start

    from pipeline import security

    keys = tmp_path / "keys"
    for name in ("server", "viewer"):
        security.generate_keys(name, keys)
    (keys / "allowed").mkdir()
    (keys / "allowed" / "viewer.key").write_bytes((keys / "viewer.key").read_bytes())
    path = write_config(
        f"""
        [security]
        server_secret_key = "{keys / "server.key_secret"}"
        authorized_clients = "{keys / "allowed"}"
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "card"
        url = "synthetic:?width=64&height=48&fps=20"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        """
    )

    async def main():
        pipeline, task = await start(path, duration=20)
        publish = pipeline.stages["publish"]
        await asyncio.wait_for(publish.bound.wait(), 5)
        curve = security.client_curve(keys / "server.key", keys / "viewer.key_secret")
        view = ViewServer(publish.endpoint, ["det/"], curve, "127.0.0.1", 0)
        await view.start()
        topics = []
        async with aiohttp.ClientSession() as http, http.ws_connect(view.url + "ws") as ws:
            while topics.count("det/card") < 3:
                msg = await asyncio.wait_for(ws.receive(), 10)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    topics.append(wire.decode(unpack(msg.data)).topic)
        await view.close()
        pipeline.stop()
        return await task, topics

    code, topics = asyncio.run(main())
    assert code == 0
    assert "det/card" in topics and set(topics) <= {"meta", "det/card"}
