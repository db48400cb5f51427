"""Subscribers that misbehave do not slow the pipeline: one that never reads, one that joins
late, one that disconnects and reconnects. Proven against a baseline phase of the same run.

The pipeline: two synthetic cameras (960x720 at FPS) -> publish with frame metadata on
det/<camera> and a JPEG preview (~48 KB) on preview/<camera>, SNDHWM 20, so a subscriber
that never reads fills its kernel buffers and its ZeroMQ pipe within about a second.

Latency is the pipeline's, as a healthy subscriber sees it: publish_ts - capture_ts of its
det/ messages (grab -> handed to ZeroMQ); the pipeline runs as `npucam run` in its own
process. Delivery time to the healthy subscriber (receive - publish_ts) is printed, not
asserted: it is measured in this test process, which also runs the other subscribers.
Tolerances: during the faults p50 <= baseline p50 + 5 ms and
p95 <= baseline p95 + 25 ms (half a frame period). A PUB that waited for the stuck subscriber
would add at least a frame period (50 ms) to every frame, or stop the stream; the slack
absorbs the extra sends to three more peers and the noise of a 2-core machine shared with
other test runs (measured p95 rises of 2-10 ms). Run it on a machine that is not saturated:
beside a 4-camera soak on the same 2 cores, capture itself stalls for hundreds of ms in
either phase and the comparison means nothing.

What ZeroMQ tells: nothing at the publisher. A PUB/XPUB past a subscriber's high-water mark
drops that subscriber's messages silently (no counter, no event; zeromq/libzmq#4394), so the
publish stage cannot count them. They are observable at the subscriber, as gaps in a
camera's seq; the pipeline's own drops (queue_full, stale) are counted in metrics and on
`stats`, and a healthy subscriber's gaps must not exceed them.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
import zmq
import zmq.asyncio
from rel_helpers import NpucamRun, Recorder, percentile, seq_gaps

from pipeline import wire
from pipeline.messages import now_ns

FPS = 20
PHASE_S = 3.0
CAMERAS = ("a", "b")
P50_SLACK_MS = 5.0
P95_SLACK_MS = 25.0


def config_text(endpoint: str) -> str:
    cams = "".join(
        f"""
        [[cameras]]
        name = "{name}"
        url = "synthetic:?width=960&height=720&fps={FPS}"
        """
        for name in CAMERAS
    )
    return f"""
        [metrics]
        stats_interval_s = 1.0
        {cams}
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "{endpoint}"
        sndhwm = 20
        preview = true
        preview_fps = {FPS}  # every frame: the traffic that fills a stuck subscriber's buffers
        preview_max_width = 960
        inbox = {{ size = 8, policy = "drop_oldest" }}
    """


def latencies(rec: Recorder, t0_ns: int, t1_ns: int) -> tuple[list[float], list[float]]:
    """(publish_ts - capture_ts, received - publish_ts) in ms of det/ messages published in
    [t0_ns, t1_ns)."""
    pipe, deliver = [], []
    for s in rec.seen:
        h = s.header
        if s.message.topic.startswith("det/") and t0_ns <= h["publish_ts"] < t1_ns:
            pipe.append((h["publish_ts"] - h["capture_ts"]) / 1e6)
            deliver.append((s.received_ns - h["publish_ts"]) / 1e6)
    return pipe, deliver


def det_seqs(rec: Recorder, camera: str) -> list[int]:
    return [s.header["seq"] for s in rec.frames(camera)]


def raw_sub(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A subscriber that never reads: 1-message receive HWM, 4 KiB kernel receive buffer."""
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


@pytest.mark.parametrize(
    "latency",
    # the rate and latency against the baseline phase are the wall clock's: slow only
    [pytest.param(False, id="drops"), pytest.param(True, id="latency", marks=pytest.mark.slow)],
)
def test_stuck_late_and_reconnecting_subscribers_leave_latency_unchanged(
    write_config, free_port, latency
):
    endpoint = f"tcp://127.0.0.1:{free_port}"
    run = NpucamRun(write_config(config_text(endpoint)))

    async def main():
        # det/ and stats only: the previews (~2 MB/s) are the stuck subscriber's load; a
        # Python reader of them fell behind on a loaded host and PUB dropped its messages
        # past SNDHWM, uncounted (below), which is the host's speed, not the pipeline's
        healthy = await Recorder(endpoint, topic="det/", also=("stats",)).start()
        await healthy.wait_for(lambda: len(healthy.seen) > 20, 15, "healthy subscriber")
        await asyncio.sleep(0.5)  # warm-up

        t0 = now_ns()
        await asyncio.sleep(PHASE_S)  # baseline: the healthy subscriber alone
        t1 = now_ns()

        ctx = zmq.Context()
        stuck = raw_sub(ctx, endpoint)
        bouncing = await Recorder(endpoint, topic="det/").start()
        await asyncio.sleep(PHASE_S / 3)
        late = await Recorder(endpoint, topic="det/").start()
        late_joined = now_ns()
        await bouncing.stop(idle_s=0)  # disconnects mid-stream...
        away = now_ns()
        await asyncio.sleep(0.5)
        rejoin = now_ns()  # nothing published from away to here can reach either socket
        back = await Recorder(endpoint, topic="det/").start()  # ...and comes back
        back_at = now_ns()
        await asyncio.sleep(2 * PHASE_S / 3)
        t2 = now_ns()
        # The stuck one finally reads for a second: its backlog, then the live stream again.
        stuck_got = await asyncio.to_thread(read_for, stuck, 1.0)
        stuck.close(0)
        ctx.term()
        run.signal(signal.SIGTERM)
        for rec in (healthy, late, back):
            await rec.stop(idle_s=0.5)
        return dict(
            healthy=healthy,
            bouncing=bouncing,
            late=late,
            back=back,
            stuck=stuck_got,
            t=(t0, t1, t2, late_joined, away, rejoin, back_at),
        )

    try:
        r = asyncio.run(main())
        code, err = run.wait()
    finally:
        run.kill()
    assert code == 0, err
    t0, t1, t2, late_joined, away, rejoin, back_at = r["t"]
    healthy: Recorder = r["healthy"]
    base_pipe, base_deliver = latencies(healthy, t0, t1)
    fault_pipe, fault_deliver = latencies(healthy, t1, t2)
    summary = {
        name: (percentile(v, 0.5), percentile(v, 0.95), len(v))
        for name, v in (
            ("baseline pipeline", base_pipe),
            ("faults pipeline", fault_pipe),
            ("baseline delivery", base_deliver),
            ("faults delivery", fault_deliver),
        )
    }
    print()
    for name, (p50, p95, n) in summary.items():
        print(f"LATENCY {name}: p50 {p50:.2f} ms, p95 {p95:.2f} ms over {n} messages")
    # Enough messages for percentiles, and the faults did not slow the stream. (Drawing the
    # 960x720 cards costs CPU: on a loaded machine the cameras fall below FPS in both phases
    # alike, so the rate is compared with the baseline phase, not with FPS.)
    assert len(base_pipe) >= 20
    if latency:
        assert len(fault_pipe) >= 0.8 * len(base_pipe)
        b50, b95, _ = summary["baseline pipeline"]
        f50, f95, _ = summary["faults pipeline"]
        assert f50 <= b50 + P50_SLACK_MS, (b50, f50)
        assert f95 <= b95 + P95_SLACK_MS, (b95, f95)

    # The pipeline's own drops, from the final stats message (sent after the drain).
    final = healthy.stats()[-1].header["stats"]["stages"]["publish"].get("drops", {})
    for cam in CAMERAS:
        counted = sum(final.get(cam, {}).values())
        seqs = det_seqs(healthy, cam)
        assert seqs == sorted(set(seqs))
        # The healthy subscriber misses only what the pipeline itself dropped (and counted).
        assert seq_gaps(seqs) <= counted

        # The late joiner sees nothing from before it joined, then every frame.
        late = det_seqs(r["late"], cam)
        assert r["late"].frames(cam)[0].header["publish_ts"] >= late_joined - 50_000_000
        assert late[0] > seqs[0] and seq_gaps(late) <= counted

        # The reconnecting one has a hole for the time it was away, and nothing else lost.
        before, after = det_seqs(r["bouncing"], cam), det_seqs(r["back"], cam)
        assert before and after and seq_gaps(before) + seq_gaps(after) <= counted
        hole = after[0] - before[-1] - 1
        away_s = (back_at - away) / 1e9
        print(f"RECONNECT {cam}: {hole} seqs missed while away {away_s:.2f} s")
        # at least every message published while it was away (the healthy subscriber's
        # count, not half of FPS: a loaded host publishes fewer), at most what FPS allows;
        # less 2: a message is stamped before it is sent, so one stamped just before `rejoin`
        # can leave after the new socket connected (11 published, 10 missed under make
        # test-loaded)
        away_published = sum(away < s.header["publish_ts"] < rejoin for s in healthy.frames(cam))
        assert away_published - 2 <= hole <= FPS * (away_s + 0.5), (away_published, hole)

        # The stuck one got a prefix, lost what came while its buffers were full, then the
        # live stream again: the seq gap is the only place PUB's drops show.
        stuck = [m.header["seq"] for m in r["stuck"] if m.topic == f"det/{cam}"]
        published = len([s for s in healthy.frames(cam) if t1 <= s.header["publish_ts"] <= t2])
        lost = seq_gaps(stuck)
        print(
            f"STUCK {cam}: received {len(stuck)}, lost (seq gaps) {lost}; "
            f"{published} published while it did not read"
        )
        assert stuck == sorted(set(stuck))
        assert lost > 0  # PUB dropped for it instead of waiting


def read_for(sock: zmq.Socket, seconds: float) -> list[wire.Message]:
    """Every message that arrives within seconds."""
    got = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            got.append(wire.decode(sock.recv_multipart()))
    return got
