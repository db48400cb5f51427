"""The capture stage in a running pipeline: cameras fail by their own policy while the
others keep flowing, malformed frames on a zmq camera are counted and skipped, and each
camera's health and fps reach the metrics."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import zmq
import zmq.asyncio
from engine_stages import start, until

from pipeline.messages import Frame, now_ns
from stages.frame_wire import encode_frame

STEADY = 'name = "steady"\nurl = "synthetic:?width=32&height=24&fps=30"'


def config_with(doomed: str) -> str:
    return f"""
[metrics]
stats_interval_s = 0
[[cameras]]
{STEADY}
[[cameras]]
name = "doomed"
{doomed}
[[stages]]
kind = "capture"
[[stages]]
name = "sink"
kind = "engine_stages:Collect"
inbox = {{ size = 64, policy = "drop_oldest" }}
"""


def frames_of(pipeline, camera: str) -> list:
    return [f for f in pipeline.stages["sink"].items if f.camera == camera]


def camera_stats(pipeline, camera: str) -> dict:
    """The camera's entry in the metrics snapshot ({} until capture has registered it)."""
    return pipeline.metrics.snapshot()["cameras"].get(camera, {})


def test_a_removed_file_ends_its_camera_by_policy_while_the_other_keeps_flowing(
    write_config, make_clip
):
    clip = make_clip("doomed.avi", frames=10, fps=20)  # 0.5 s a loop
    path = write_config(config_with(f'url = "{clip.name}"\nloop = true\nend = "stop"'))

    async def main():
        pipeline, task = await start(path)
        await until(lambda: frames_of(pipeline, "doomed"), "the doomed camera's first frame")
        clip.unlink()  # the running loop finishes; reopening for the next loop fails
        await until(
            lambda: camera_stats(pipeline, "doomed").get("health") == "ended",
            "the doomed camera's health 'ended'",
        )
        health = camera_stats(pipeline, "doomed")["health"]
        steady_at_end = len(frames_of(pipeline, "steady"))
        await until(
            lambda: len(frames_of(pipeline, "steady")) > steady_at_end + 10, "10 more steady"
        )
        # the sink takes its inbox in order: the doomed frames sent before the end are in
        doomed_at_end = len(frames_of(pipeline, "doomed"))
        pipeline.stop()
        return pipeline, await task, health, doomed_at_end, steady_at_end

    pipeline, code, health, doomed_at_end, steady_at_end = asyncio.run(main())
    assert code == 0
    assert health == "ended"
    doomed = frames_of(pipeline, "doomed")
    # whole loops of 10 (the one in flight when the file went), then nothing after the end
    assert doomed and len(doomed) % 10 == 0 and len(doomed) == doomed_at_end
    assert [f.seq for f in doomed] == list(range(len(doomed)))
    steady = frames_of(pipeline, "steady")
    assert len(steady) > steady_at_end + 10  # still flowing after the other camera ended
    assert [f.seq for f in steady] == sorted(f.seq for f in steady)


def test_a_camera_with_end_reconnect_comes_back_when_its_file_returns(write_config, make_clip):
    clip = make_clip("doomed.avi", frames=10, fps=20)
    spare = clip.with_suffix(".bak")
    shutil.copy(clip, spare)
    path = write_config(
        config_with(
            f'url = "{clip.name}"\nloop = true\nend = "reconnect"\n'
            "reconnect_min_s = 0.1\nreconnect_max_s = 0.2"
        )
    )

    async def main():
        pipeline, task = await start(path)
        await until(lambda: frames_of(pipeline, "doomed"), "the doomed camera's first frame")
        clip.unlink()
        await until(
            lambda: camera_stats(pipeline, "doomed").get("reconnects", 0) >= 1,
            "a failed reopen of the removed file",
        )
        gone = camera_stats(pipeline, "doomed")
        count_gone = len(frames_of(pipeline, "doomed"))
        steady_gone = len(frames_of(pipeline, "steady"))
        await until(lambda: len(frames_of(pipeline, "steady")) > steady_gone + 10, "10 more steady")
        shutil.copy(spare, clip)
        await until(lambda: len(frames_of(pipeline, "doomed")) > count_gone + 5, "doomed back")
        pipeline.stop()
        return pipeline, await task, gone, count_gone, steady_gone

    pipeline, code, gone, count_gone, steady_gone = asyncio.run(main())
    assert code == 0
    assert gone["health"] == "reconnecting" and gone["reconnects"] >= 1
    doomed = frames_of(pipeline, "doomed")
    assert len(doomed) > count_gone + 5  # back online after the file came back
    seqs = [f.seq for f in doomed]
    assert seqs == list(range(len(seqs)))  # seq keeps counting across the outage
    # the other camera flowed through the outage (before the file came back)
    assert len(frames_of(pipeline, "steady")) > steady_gone + 10


def test_a_malformed_message_on_a_zmq_camera_is_counted_and_skipped(write_config, free_port):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    path = write_config(
        f"""
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "remote"
        url = "zmq:{endpoint}"
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "sink"
        kind = "engine_stages:Collect"
        inbox = {{ size = 16, policy = "block" }}
        """
    )
    images = [np.full((24, 32, 3), 40 * i, np.uint8) for i in range(4)]

    async def main():
        ctx = zmq.asyncio.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.bind(endpoint)
        pipeline, task = await start(path, duration=2.0)
        t = now_ns()
        sent = [
            encode_frame(Frame("far", i, t, t + 10**10, im, "far:cam"), "raw")
            for i, im in enumerate(images)
        ]
        await push.send_multipart(sent[0])
        await push.send_multipart([b"not a frame header", b"\x00" * 7])
        await push.send_multipart([b'{"v": 1}'])
        for parts in sent[1:]:
            await push.send_multipart(parts)
        code = await task
        push.close()
        ctx.term()
        return pipeline, code

    pipeline, code = asyncio.run(main())
    assert code == 0
    got = pipeline.stages["sink"].items
    assert [f.seq for f in got] == [0, 1, 2, 3]
    for frame, image in zip(got, images, strict=True):
        np.testing.assert_array_equal(frame.image, image)
    stats = pipeline.metrics.snapshot()["cameras"]["remote"]
    assert stats["bad_messages"] == 2
    assert stats["frames"] == 4


def test_a_cut_stream_reconnects_while_the_other_camera_keeps_flowing(write_config):
    from mjpeg_server import MjpegServer  # the capture tests' loopback MJPEG camera

    with MjpegServer(fps=25) as server:
        path = write_config(
            config_with(
                f'url = "{server.url}"\nstall_timeout_s = 1.0\n'
                "reconnect_min_s = 0.2\nreconnect_max_s = 0.5"
            )
        )

        async def main():
            pipeline, task = await start(path)
            await until(lambda: len(frames_of(pipeline, "doomed")) > 5, "doomed flowing")
            before_cut = len(frames_of(pipeline, "doomed"))
            server.down()
            await until(
                lambda: camera_stats(pipeline, "doomed").get("reconnects", 0) >= 1,
                "a reconnect attempt",
            )
            cut = camera_stats(pipeline, "doomed")
            during_cut = len(frames_of(pipeline, "doomed"))
            steady_cut = len(frames_of(pipeline, "steady"))
            await until(lambda: len(frames_of(pipeline, "steady")) > steady_cut + 5, "steady")
            steady_after = len(frames_of(pipeline, "steady"))
            server.up()
            await until(lambda: len(frames_of(pipeline, "doomed")) > during_cut + 10, "doomed")
            pipeline.stop()
            code = await task
            return pipeline, code, before_cut, during_cut, cut, steady_cut, steady_after

        pipeline, code, before_cut, during_cut, cut, steady_cut, steady_after = asyncio.run(main())
    assert code == 0
    assert before_cut > 5
    assert cut["health"] == "reconnecting" and cut["reconnects"] >= 1
    assert steady_after > steady_cut + 5  # the other camera flowed through the outage
    doomed = frames_of(pipeline, "doomed")
    assert len(doomed) > during_cut + 10  # back online after the stream returned
    assert [f.seq for f in doomed] == list(range(len(doomed)))


def test_max_pixels_reaches_a_zmq_cameras_reader_and_is_refused_elsewhere(write_config):
    from pipeline.config import ConfigError, load_config
    from pipeline.graph import check_stages
    from stages.capture import camera_spec

    text = """
        [[cameras]]
        name = "remote"
        url = "zmq:tcp://127.0.0.1:5999"
        max_pixels = 12000000
        [[cameras]]
        name = "card"
        url = "synthetic:"
        {extra}
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
    """
    config = load_config(write_config(text.format(extra="")))
    check_stages(config)
    assert camera_spec(config.cameras[0], config).max_pixels == 12_000_000
    bad = write_config(text.format(extra="max_pixels = 100"), "bad.toml")
    try:
        check_stages(load_config(bad))
    except ConfigError as exc:
        assert "cameras[1].max_pixels: only zmq: cameras check frame sizes" in str(exc)
    else:
        raise AssertionError("max_pixels on a synthetic camera passed")
