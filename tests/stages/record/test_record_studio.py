"""A recording of configs/studio-3d.toml replayed as `recording:` cameras forms the rig's groups
of the live run (issue 32): every group of either run holds frames of one recorded seq, and
each seq the live run grouped is one group of that seq in the replay, never split. Slow: the
per-frame pose (MediaPipe) on four cameras, live and then replayed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from pipeline import wire
from stages.record.message_log import read_messages
from stages.record.segments import segment_stems

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REPO = Path(__file__).resolve().parents[3]
NPUCAM = Path(sys.executable).parent / "npucam"
LIVE_S = 12  # about 60 instants of the rig at its 5 fps
REPLAY_GUARD_S = 180  # the replay ends with the recording; a hang guard, not a duration


def _studio(port: int) -> str:
    text = (REPO / "configs" / "studio-3d.toml").read_text()
    text = text.replace('"../.cache/', f'"{REPO}/.cache/')
    assert text.count('bind = "tcp://127.0.0.1:5564"') == 1
    return text.replace('bind = "tcp://127.0.0.1:5564"', f'bind = "tcp://127.0.0.1:{port}"')


def _groups(messages) -> list[dict[str, int]]:
    """The `views` (camera -> seq) of each pose3d message, in order."""
    return [
        wire.decode(parts).header["views"]
        for parts in messages
        if bytes(parts[0]).startswith(b"pose3d/")
    ]


def test_a_recorded_studio_replays_as_the_rigs_same_groups(tmp_path, free_port):
    live = _studio(free_port)
    live = live.replace("synchronized = true", 'synchronized = true\nto = ["detect", "record"]', 1)
    live += f'\n[[stages]]\nkind = "record"\npath = "{tmp_path}/rec"\nsession = "live"\n'
    (tmp_path / "live.toml").write_text(live)
    run = subprocess.run(
        [str(NPUCAM), "run", str(tmp_path / "live.toml"), "--duration", str(LIVE_S)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIVE_S + 120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    session = tmp_path / "rec" / "live"
    logs = segment_stems(session / "messages", ".msgs")
    live_groups = _groups(
        parts for stem in logs for _, parts in read_messages(stem.with_suffix(".msgs"))
    )

    replay = re.sub(r'url = "[^"]*\.mp4"', f'url = "recording:{session}"', _studio(free_port))
    replay = replay.replace("loop = true", 'loop = false\nend = "stop"')  # fps kept: the rig's
    replay = replay.replace("synchronized = true", "")  # the recording's times align them
    replay = replay.replace(f':{free_port}"', f':{free_port}"\nwait_for_subscribers = 1')
    (tmp_path / "replay.toml").write_text(replay)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"pose3d/")
    sub.connect(f"tcp://127.0.0.1:{free_port}")
    proc = subprocess.Popen(
        [str(NPUCAM), "run", str(tmp_path / "replay.toml")],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    received = []
    try:
        while proc.poll() is None:
            if sub.poll(200):
                received.append(sub.recv_multipart())
        while sub.poll(1000):  # what was sent before the exit
            received.append(sub.recv_multipart())
        err = proc.stderr.read()
        proc.wait(timeout=REPLAY_GUARD_S)
    finally:
        proc.kill()
        sub.close()
        ctx.term()
    assert proc.returncode == 0, err[-2000:]
    replay_groups = _groups(received)

    for groups in (live_groups, replay_groups):
        assert groups and all(len(set(views.values())) == 1 for views in groups), groups
    live_seqs = [next(iter(views.values())) for views in live_groups]
    replay_seqs = [next(iter(views.values())) for views in replay_groups]
    assert len(set(replay_seqs)) == len(replay_seqs), "an instant split into two groups"
    assert set(live_seqs) <= set(replay_seqs), sorted(set(live_seqs) - set(replay_seqs))
