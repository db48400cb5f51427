"""A progressive JPEG whose scans are repeated (issue 33, finding 2): its header and size pass
a `zmq:` camera's pixel cap, so it was decoded, and libjpeg runs every repeated 10-byte scan
over the whole image (0.73 ms a repeat at 3840 x 2160 here): the 25 MB a message may carry
held the camera's reader for minutes. Now the markers are walked before decoding
(pipeline/jpeg.py) and a JPEG with more than MAX_SCANS scans, or a coding no camera sends, is
refused and counted in `bad_messages` like any malformed frame; `npucam subscribe` refuses it
too. The hostile JPEG is built here (tests/reliability/hostile_inputs.py: Pillow's progressive
encoder, its last scan header repeated).
"""

from __future__ import annotations

import asyncio
import logging
import time

import cv2
import numpy as np
import pytest
from hostile_inputs import scan_bomb, with_fields
from rel_helpers import pushed_run

from pipeline.commands import summarise
from pipeline.jpeg import MAX_SCANS, JpegError, jpeg_info
from pipeline.messages import Frame, now_ns
from stages import frame_wire
from stages.frame_wire import FrameWireError, decode_frame, encode_frame

IMAGE = np.full((48, 64, 3), 90, np.uint8)
IMAGE[::7] = 30


def test_a_progressive_jpeg_of_repeated_scans_is_refused_before_the_decoder_runs(monkeypatch):
    def no_decode(*args, **kwargs):
        raise AssertionError("cv2.imdecode ran on a refused JPEG")

    good = scan_bomb(IMAGE, 0)
    assert jpeg_info(good).scans == 10  # Pillow's progressive colour script
    bomb = scan_bomb(IMAGE, 1000)
    assert cv2.imdecode(np.frombuffer(bomb, np.uint8), cv2.IMREAD_COLOR).shape == IMAGE.shape
    with pytest.raises(JpegError, match=f"more than {MAX_SCANS} scans"):
        jpeg_info(bomb)
    header = encode_frame(Frame("s", 1, now_ns(), now_ns() + 10**9, IMAGE, "cam"))[0]
    monkeypatch.setattr(frame_wire.cv2, "imdecode", no_decode)
    with pytest.raises(FrameWireError, match=f"camera 's' seq 1: JPEG has more than {MAX_SCANS}"):
        decode_frame([header, bomb], max_pixels=3840 * 2160)
    out = summarise(
        np.frombuffer(bomb, np.uint8), {"dtype": "uint8", "shape": [len(bomb)], "encoding": "jpeg"}
    )
    assert "more than 32 scans" in out["refused"] and "decoded" not in out
    # the limit is where it is cheap: the 4K image's refusal costs the walk, not the decode
    big = np.full((2160, 3840, 3), 90, np.uint8)
    big[::7] = 30
    bomb4k = scan_bomb(big, 2000)
    start_cpu = time.process_time()
    with pytest.raises(JpegError):
        jpeg_info(bomb4k)
    refused_ms = (time.process_time() - start_cpu) * 1e3
    print(
        f"\n3840x2160 with 2000 repeated scans ({len(bomb4k)} bytes): "
        f"refused in {refused_ms:.1f} ms CPU"
    )


@pytest.mark.parametrize("sof", [0xC3, 0xC9, 0xCA, 0xCB])
def test_lossless_and_arithmetic_codings_are_refused_naming_the_coding(sof):
    data = bytearray(scan_bomb(IMAGE, 0))
    at = data.index(b"\xff\xc2")
    data[at + 1] = sof
    with pytest.raises(JpegError, match=f"coding SOF{sof - 0xC0} is refused"):
        jpeg_info(bytes(data))


def test_zmq_camera_counts_a_scan_bomb_as_a_bad_message_and_serves_the_next_frame(
    write_config, free_port, caplog
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = write_config(
        f"""
        [metrics]
        stats_interval_s = 0.2
        [[cameras]]
        name = "remote"
        url = "zmq:{endpoint}"
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        inbox = {{ size = 64, policy = "block" }}
        """
    )

    def valid(seq: int) -> list[bytes]:
        return encode_frame(Frame("sender", seq, now_ns(), now_ns() + 10**9, IMAGE, "cam"))

    bomb = [with_fields(valid(1)[0], seq=1), scan_bomb(IMAGE, 1000)]
    stream = [valid(0), bomb, valid(2)]

    async def main():
        async with pushed_run(path, endpoint) as run:
            rec = run.rec
            await asyncio.sleep(0.3)  # the subscription reaches the publisher
            for msg in stream:
                await asyncio.to_thread(run.push.send_multipart, msg)
            await rec.wait_for(
                lambda: any(s.header["seq"] == 2 for s in rec.frames("remote")), 15, "frame 2"
            )
            await rec.wait_for(
                lambda: (
                    rec.stats()
                    and rec.stats()[-1].header["stats"]["cameras"]["remote"]["frames"] >= 2
                ),
                5,
                "stats after frame 2",
            )
            last = rec.stats()[-1].header["stats"]["cameras"]["remote"]
        return run.code, rec, last

    with caplog.at_level(logging.WARNING, logger="stages.sources"):
        code, rec, last = asyncio.run(main())
    assert code == 0
    assert [s.header["seq"] for s in rec.frames("remote")] == [0, 2]
    assert last["bad_messages"] == 1 and last["health"] == "online"
    skipped = [r.getMessage() for r in caplog.records if "skipped bad message" in r.getMessage()]
    assert len(skipped) == 1 and f"more than {MAX_SCANS} scans" in skipped[0]
