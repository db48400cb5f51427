"""Record the demo (configs/demo.toml plus a record stage) for --seconds with `npucam run`, then
`npucam replay` it at the recorded pace to a subscriber in this process, and measure how far
each message's arrival is from its recorded time: error_k = (arrival_k - arrival_0) -
(receive_ts_k - receive_ts_0), and the gap error |(arrival_k - arrival_k-1) - (receive_ts_k -
receive_ts_k-1)|. The reference, in the same run: the same messages sent by a bare pyzmq PUB
in a thread of this process pacing itself with time.sleep to each recorded time (what a pacer
without npucam's replay costs on this host). Also checks that the replayed messages are the
recorded ones, in order, byte for byte.

    .venv/bin/python bench/replay_timing.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ports import free_port  # noqa: E402

from stages.record.replay import messages  # noqa: E402


def record(folder: Path, seconds: float) -> Path:
    """configs/demo.toml with a record stage, run for `seconds`; the session folder."""
    text = (REPO / "configs" / "demo.toml").read_text()
    text = text.replace('bind = "tcp://127.0.0.1:5560"', f'bind = "tcp://127.0.0.1:{free_port()}"')
    text = text.replace('kind = "capture"\n', 'kind = "capture"\nto = ["detect", "record"]\n', 1)
    text += f'\n[[stages]]\nkind = "record"\npath = "{folder / "rec"}"\nsession = "demo"\n'
    # in the temporary folder its relative bundle paths find nothing: the synthetic models, as
    # on a fresh clone (tests/conftest.py's demo_config)
    config = folder / "demo.toml"
    config.write_text(text)
    # a context table of its own: the simulator's is machine-wide (npu/sim.py), and other
    # runs on this host may hold its 16 contexts
    (folder / "hwctx").mkdir()
    env = {**os.environ, "NPUCAM_SIM_HWCTX_DIR": str(folder / "hwctx")}
    subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(config), "--duration", str(seconds)],
        check=True,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return folder / "rec" / "demo"


def receive(endpoint: str, count: int) -> list[tuple[int, list[bytes]]]:
    """(arrival monotonic ns, parts) of `count` messages from endpoint."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(endpoint)
    got = []
    while len(got) < count and sub.poll(30_000):
        parts = sub.recv_multipart()
        got.append((time.monotonic_ns(), parts))
    sub.close()
    ctx.term()
    return got


def replay_command(session: Path, count: int) -> list:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "replay", str(session), "--bind", "tcp://127.0.0.1:*"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    endpoint = proc.stdout.readline().rsplit(" on ", 1)[1].strip()
    got = receive(endpoint, count)
    proc.wait(60)
    return got


def replay_bare(recorded: list, count: int) -> list:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")

    def send():
        pub.recv()  # the subscription
        start, first = time.monotonic(), recorded[0][0]
        for ts, parts in recorded:
            delay = start + (ts - first) / 1e9 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pub.send_multipart(parts)

    sender = threading.Thread(target=send)
    sender.start()
    got = receive(f"tcp://127.0.0.1:{port}", count)
    sender.join()
    pub.close()
    ctx.term()
    return got


def errors(recorded: list, got: list) -> tuple[np.ndarray, np.ndarray]:
    """(|error_k| ms, gap error ms) of each message."""
    rec = np.array([ts for ts, _ in recorded], np.int64)
    arr = np.array([t for t, _ in got], np.int64)
    err = np.abs((arr - arr[0]) - (rec - rec[0])) / 1e6
    gap = np.abs(np.diff(arr) - np.diff(rec)) / 1e6
    return err, gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        session = record(Path(tmp), args.seconds)
        recorded = list(messages(session))
        frames = sum(1 for _ in (session / "frames").rglob("*.csv"))
        print(f"recorded {len(recorded)} messages, {frames} frame segments, {args.seconds:g} s")
        rows = {}
        for name, run in (
            ("npucam replay", lambda: replay_command(session, len(recorded))),
            ("bare pyzmq + time.sleep (reference)", lambda: replay_bare(recorded, len(recorded))),
        ):
            got = run()
            same = [parts for _, parts in got] == [parts for _, parts in recorded]
            err, gap = errors(recorded, got)
            rows[name] = (err, gap)
            print(
                f"{name}: {len(got)} messages, identical bytes in order: {same}; "
                f"|error| p50 {np.percentile(err, 50):.2f} p95 {np.percentile(err, 95):.2f} "
                f"max {err.max():.2f} ms; gap error p95 {np.percentile(gap, 95):.2f} ms"
            )
        ours, ref = (np.percentile(rows[n][0], 95) for n in rows)
        print(f"p95 |error| ratio npucam / reference: {ours / max(ref, 1e-3):.2f}")
        print(f"(recorded message count by topic kind: {topic_counts(recorded)})")


def topic_counts(recorded: list) -> dict:
    counts: dict[str, int] = {}
    for _, parts in recorded:
        kind = bytes(parts[0]).split(b"/")[0].decode()
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    main()
