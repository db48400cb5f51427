"""Shutdown loses nothing it accepted: `npucam run` (a subprocess) on two file cameras with
`block` queues gets SIGTERM or SIGINT mid-run, while frames wait in every queue and one is
inside a slow stage's worker; or runs to the end of its files.

A subscriber connects before the pipeline starts (publish waits for it:
wait_for_subscribers = 1) and counts seqs per camera. Proven: exit code 0; every camera's
seqs arrive exactly once each, as 0..k-1 without a gap; k equals what capture handed to the
pipeline (capture `out` in the final stats message, sent after the drain) and what publish
sent; nothing is dropped anywhere; items in flight at the signal are published after it; and
without a signal k is every frame of the file.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import zmq
from rel_helpers import NpucamRun

from pipeline import wire
from pipeline.messages import now_ns

FRAMES = 150
CAMERAS = ("left", "right")
SIGNAL_AFTER = 40  # det messages received before the signal
ENGINE_STAGES = str(Path(__file__).resolve().parents[1] / "pipeline")


def config_text(endpoint: str, clips: dict[str, Path]) -> str:
    cams = "".join(
        f"""
        [[cameras]]
        name = "{name}"
        url = "{path}"
        realtime = false
        staleness_ms = 600000
        """
        for name, path in clips.items()
    )
    return f"""
        [pipeline]
        drain_timeout_s = 10.0
        [metrics]
        stats_interval_s = 0
        {cams}
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "slow"
        kind = "engine_stages:Slow"
        delay_s = 0.005
        inbox = {{ size = 8, policy = "block" }}
        [[stages]]
        kind = "publish"
        bind = "{endpoint}"
        wait_for_subscribers = 1
        inbox = {{ size = 8, policy = "block" }}
    """


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, None], ids=["TERM", "INT", "end"])
def test_signal_mid_run_flushes_every_accepted_frame_exactly_once(
    sig, make_clip, write_config, free_port
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    clips = {name: make_clip(f"{name}.avi", frames=FRAMES) for name in CAMERAS}
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)  # before the pipeline exists: ZeroMQ connects when it binds
    run = NpucamRun(write_config(config_text(endpoint, clips)), env={"PYTHONPATH": ENGINE_STAGES})
    seqs: dict[str, list[int]] = {name: [] for name in CAMERAS}
    final = None
    signalled_ns = None
    after_signal = 0
    try:
        while final is None:
            assert sub.poll(20_000), "no message for 20 s"
            m = wire.decode(sub.recv_multipart())
            if m.topic == "stats":
                final = m.header["stats"]
                continue
            if m.topic == "meta":  # what every new subscriber gets: no frame of a camera
                continue
            seqs[m.header["camera"]].append(m.header["seq"])
            if signalled_ns is not None and m.header["capture_ts"] <= signalled_ns:
                after_signal += 1
            if (
                sig is not None
                and signalled_ns is None
                and sum(map(len, seqs.values())) >= (SIGNAL_AFTER)
            ):
                signalled_ns = now_ns()
                run.signal(sig)
        code, err = run.wait()
    finally:
        run.kill()
        sub.close(0)
        ctx.term()
    assert code == 0, err
    stages = final["stages"]
    for name in CAMERAS:
        k = len(seqs[name])
        assert seqs[name] == list(range(k)), f"{name}: seqs not 0..{k - 1} exactly once"
        assert stages["capture"]["out"][name] == k
        assert stages["slow"]["out"][name] == k
        assert stages["publish"]["out"][name] == k
        if sig is None:
            assert k == FRAMES
        else:
            assert k < FRAMES, "the signal came after the end of the files"
    assert all(not s.get("drops") for s in stages.values()), stages
    if sig is not None:
        # Frames grabbed before the signal but still queued or in the slow stage then.
        assert after_signal > 0
        print(f"\n{signal.Signals(sig).name}: {after_signal} in-flight frames published after it")
