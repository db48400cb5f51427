"""The record stage end to end: every frame and every message publish sent recorded (the
messages byte for byte as a live subscriber got them), `npucam replay` giving a subscriber the
same messages in the same order with identical bytes, a folder that never passes its size cap,
a read-only folder that costs counted drops while the pipeline runs on, and `kill -9` leaving
every segment readable."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import zmq
from engine_stages import run_and_receive

from pipeline import wire
from stages.record import replay
from stages.record.frame_log import read_frames
from stages.record.message_log import read_messages
from stages.record.segments import segment_stems

REPO = Path(__file__).resolve().parents[3]


def noise_clip(path: Path, frames: int, size=(320, 240), fps: float = 25.0) -> list[np.ndarray]:
    """A clip of random frames (JPEG cannot shrink them much); the frames OpenCV reads back."""
    rng = np.random.default_rng(0)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, size)
    for _ in range(frames):
        writer.write(rng.integers(0, 256, (size[1], size[0], 3), np.uint8))
    writer.release()
    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    read = []
    while (frame := cap.read())[0]:
        read.append(frame[1])
    cap.release()
    return read


def config_text(clip: Path, record: str, publish_extra: str = "") -> str:
    return f"""
        [metrics]
        stats_interval_s = 0.3
        [[cameras]]
        name = "cam"
        url = "{clip}"
        realtime = false
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        to = ["publish", "record"]
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        inbox = {{ size = 8, policy = "block" }}
        {publish_extra}
        [[stages]]
        kind = "record"
        inbox = {{ size = 8, policy = "block" }}
        {record}
        """


def frames_of(folder: Path) -> list:
    stems = segment_stems(folder, ".csv")
    return [item for s in stems for item in read_frames(s.with_suffix(".csv"))]


def test_every_frame_and_every_message_publish_sent_is_recorded(tmp_path, write_config):
    clip = noise_clip(tmp_path / "clip.avi", 30)
    path = write_config(config_text(tmp_path / "clip.avi", 'path = "rec"\nsession = "s1"'))
    pipeline, code, live = run_and_receive(path, duration=60, until_idle_s=2.0)
    assert code == 0
    session = tmp_path / "rec" / "s1"
    recorded = [parts for _, parts in replay.messages(session)]
    # publish sends stats before its first subscriber (to nobody): recorded, not received;
    # from the first message the subscriber got (meta, or a stats sent as it subscribed)
    first = recorded.index(live[0])
    assert {m[0] for m in recorded[:first]} <= {b"stats"}
    # from then on what the one subscriber received is what publish sent, byte for byte
    recorded = recorded[first:]
    assert recorded == live
    topics = [wire.decode(m).topic for m in recorded]
    assert topics.count("meta") == 1 and topics[-1] == "stats" and topics.count("det/cam") == 30
    det = [wire.decode(m).header for m in recorded if m[0] == b"det/cam"]
    frames = frames_of(session / "frames" / "cam")
    assert [e.seq for e, _ in frames] == list(range(30))
    assert [e.capture_ts_ns for e, _ in frames] == [h["capture_ts"] for h in det]
    for (_, jpeg), original in zip(frames, clip, strict=True):
        # the frame capture read, coded at jpeg_quality 90 (libjpeg is deterministic)
        ok, expected = cv2.imencode(".jpg", original, [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok and jpeg == expected.tobytes()
    metrics = pipeline.metrics
    assert metrics.items_out["record", "cam"] == 30 and metrics.dropped("record") == 0


def test_npucam_replay_gives_a_subscriber_the_recorded_messages_in_order_byte_for_byte(
    tmp_path, write_config
):
    noise_clip(tmp_path / "clip.avi", 20, size=(64, 48))
    path = write_config(config_text(tmp_path / "clip.avi", 'path = "rec"\nsession = "s1"'))
    _, code, live = run_and_receive(path, duration=60, until_idle_s=2.0)
    assert code == 0
    recorded = [parts for _, parts in replay.messages(tmp_path / "rec" / "s1")]
    assert recorded[len(recorded) - len(live) :] == live  # (stats before the subscriber: above)
    replayer = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "replay", str(tmp_path / "rec" / "s1"), "--fast"]
        + ["--bind", "tcp://127.0.0.1:*"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        first = replayer.stdout.readline()  # "replay: SESSION on ENDPOINT"
        endpoint = first.rsplit(" on ", 1)[1].strip()
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(endpoint)
        replayed = []
        while sub.poll(10_000):  # hang guard: the replay sends at once
            replayed.append(sub.recv_multipart())
            if len(replayed) == len(recorded):
                break
        sub.close()
        ctx.term()
        assert replayer.wait(30) == 0
    finally:
        replayer.kill()
    assert replayed == recorded  # meta, det, stats: every message, its bytes and its place


def test_the_recording_folder_never_passes_max_bytes(tmp_path, write_config):
    noise_clip(tmp_path / "clip.avi", 60)  # ~60 KB a frame: ~3.6 MB against a 256 KiB cap
    cap = 1 << 18
    record = f'path = "rec"\nmax_bytes = {cap}\nsegment_bytes = {1 << 16}'
    path = write_config(config_text(tmp_path / "clip.avi", record))
    sizes = []
    done = threading.Event()

    def sample():
        while not done.is_set():
            total = 0
            for p in (tmp_path / "rec").rglob("*.*"):
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    total += p.stat().st_size
            sizes.append(total)
            done.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        pipeline, code, _ = run_and_receive(path, duration=60, until_idle_s=2.0)
    finally:
        done.set()
        sampler.join()
    assert code == 0
    assert len(sizes) > 10 and max(sizes) <= cap
    stage = pipeline.stages["record"]
    assert stage.retention.deleted > 0
    (session,) = (tmp_path / "rec").iterdir()
    kept = frames_of(session / "frames" / "cam")
    assert kept and kept[-1][0].seq == 59  # the newest frames are the ones kept
    # a frame that found no room: only while every other segment was still open
    dropped = pipeline.metrics.dropped("record", "cam", "storage")
    assert pipeline.metrics.items_out["record", "cam"] + dropped == 60


def test_a_read_only_recording_folder_costs_counted_drops_and_the_pipeline_runs_on(
    tmp_path, write_config, read_only_dir
):
    folder, _ = read_only_dir
    noise_clip(tmp_path / "clip.avi", 20, size=(64, 48))
    path = write_config(config_text(tmp_path / "clip.avi", f'path = "{folder}"'))
    pipeline, code, live = run_and_receive(path, duration=60, until_idle_s=2.0)
    assert code == 0
    assert [wire.decode(m).topic for m in live].count("det/cam") == 20  # published all
    assert pipeline.metrics.dropped("record", "cam", "storage") == 20
    assert pipeline.metrics.dropped("record", "", "storage") > 0  # the messages
    gauges = pipeline.metrics.snapshot()["stages"]["record"]["gauges"]
    assert gauges["write_failures"] >= 20 and gauges["bytes"] == 0
    assert list(folder.iterdir()) == []


def wait_for_segments(proc: subprocess.Popen, folder: Path, n: int, timeout: float = 120) -> None:
    """Until `n` segments are in folder, however long this host takes; `timeout` only bounds a
    hang of the recorder's subprocess, which must not exit meanwhile."""
    end = time.monotonic() + timeout
    while len(segment_stems(folder, ".csv")) < n:
        assert proc.poll() is None, "the recorder exited before it was killed"
        assert time.monotonic() < end, f"fewer than {n} segments in {timeout:g} s"
        time.sleep(0.1)


def test_kill_9_leaves_every_segment_readable_up_to_its_last_complete_frame(
    tmp_path, write_config, free_port
):
    path = write_config(
        f"""
        [[cameras]]
        name = "card"
        url = "synthetic:?width=320&height=240&fps=50"
        [[stages]]
        kind = "capture"
        to = ["publish", "record"]
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:{free_port}"
        inbox = {{ size = 8, policy = "block" }}
        [[stages]]
        kind = "record"
        path = "rec"
        session = "s"
        segment_s = 0.3
        inbox = {{ size = 8, policy = "block" }}
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(path)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    frames_dir = tmp_path / "rec" / "s" / "frames" / "card"
    try:
        wait_for_segments(proc, frames_dir, 4)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    stems = segment_stems(frames_dir, ".csv")
    assert len(stems) >= 4
    seqs = []
    for stem in stems:
        lines = stem.with_suffix(".csv").read_bytes().count(b"\n") - 1
        frames = list(read_frames(stem.with_suffix(".csv")))
        # every line written whole is a frame (the open segment may end in a partial line)
        assert len(frames) == lines
        for entry, jpeg in frames:
            image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            assert image is not None and image.shape == (240, 320, 3)
            seqs.append(entry.seq)
    assert seqs == list(range(len(seqs)))  # a block inbox: no frame lost between segments
    messages = [
        m
        for stem in segment_stems(tmp_path / "rec" / "s" / "messages", ".msgs")
        for _, m in read_messages(stem.with_suffix(".msgs"))
    ]
    det = [wire.decode(m).header["seq"] for m in messages if m[0] == b"det/card"]
    assert det and det == list(range(len(det)))
