"""Event clips (stages/record/clips.py and the record stage's `clips`): a matching message opens
a clip of its camera from pre_s before its capture time to post_s after, a match while open
extends it, a field rule needs the field set, clips count in the retention, and end to end a
clip is announced on events/<camera> with the frames its folder holds."""

from __future__ import annotations

import asyncio
import json

import numpy as np
from engine_stages import receive, start, subscriber

from pipeline import wire
from pipeline.graph import Stage
from pipeline.messages import Detections, Frame
from stages.record.clips import ClipRule, EventClips
from stages.record.frame_log import read_frames
from stages.record.retention import Retention

MS = 1_000_000


def _message(topic: str, camera: str, capture_ts: int, **fields) -> list[bytes]:
    header = {"kind": topic.split("/")[0], "camera": camera, "capture_ts": capture_ts, **fields}
    return [topic.encode(), json.dumps(header).encode()]


def _clips(tmp_path, *rules, cap=10**9):
    return EventClips(tmp_path / "clips", tuple(rules), Retention(cap, None))


def _frames(clips, camera, times_ms, first_seq=0):
    for i, t in enumerate(times_ms):
        clips.frame(camera, first_seq + i, t * MS, f"jpeg-{camera}-{first_seq + i}".encode())


def test_a_trigger_opens_a_clip_with_its_pre_roll_and_closes_it_after_the_post_roll(tmp_path):
    clips = _clips(tmp_path, ClipRule(topic="face/", pre_s=0.3, post_s=0.2))
    _frames(clips, "a", range(0, 1100, 100))  # seq 0..10 at 0, 100, ... 1000 ms
    clips.message(_message("face/a", "a", 1000 * MS))
    _frames(clips, "a", (1100, 1200), first_seq=11)
    assert clips.take() == []  # 1200 is still within the post-roll
    _frames(clips, "a", (1300,), first_seq=13)
    (event,) = clips.take()
    assert event.topic == "events/a" and event.seq == 1 and event.capture_ts_ns == 1000 * MS
    h = event.header_fields()
    assert (h["start_ts"], h["end_ts"], h["frames"], h["triggers"]) == (700 * MS, 1200 * MS, 6, 1)
    assert h["trigger"] == "face/a" and h["clip"] == "clips/000001-a"
    got = list(read_frames(tmp_path / h["clip"] / "000001.csv"))
    assert [e.seq for e, _ in got] == [7, 8, 9, 10, 11, 12]
    assert got[0][1] == b"jpeg-a-7"


def test_a_match_while_the_clip_is_open_extends_it(tmp_path):
    clips = _clips(tmp_path, ClipRule(topic="pose3d/", pre_s=0.0, post_s=0.1))
    _frames(clips, "a", (0,))
    clips.message(_message("pose3d/a", "a", 0))
    _frames(clips, "a", (50,), first_seq=1)
    clips.message(_message("pose3d/a", "a", 50 * MS))
    _frames(clips, "a", (100, 150, 200), first_seq=2)
    (event,) = clips.take()
    h = event.header_fields()
    assert (h["frames"], h["end_ts"], h["triggers"]) == (4, 150 * MS, 2)


def test_a_field_rule_triggers_only_on_messages_with_the_field_set(tmp_path):
    clips = _clips(tmp_path, ClipRule(topic="face/", field="identity", pre_s=0.0, post_s=0.0))
    _frames(clips, "a", (0,))
    clips.message(_message("face/a", "a", 0, identity=None))
    clips.message(_message("det/a", "a", 0, identity="alice"))  # another topic
    _frames(clips, "a", (10,), first_seq=1)
    assert clips.take() == [] and not (tmp_path / "clips").exists()
    clips.message(_message("face/a", "a", 10 * MS, identity="alice"))
    _frames(clips, "a", (20,), first_seq=2)
    assert [e.header_fields()["frames"] for e in clips.take()] == [1]


def test_a_rig_message_clips_each_of_the_rigs_cameras(tmp_path):
    clips = _clips(tmp_path, ClipRule(topic="pose3d/", field="count", pre_s=0.1, post_s=0.0))
    for camera in ("left", "right", "other"):
        _frames(clips, camera, (0, 100))
    clips.message(_message("pose3d/rig", "rig", 100 * MS, count=1, cameras=["left", "right"]))
    clips.close_all()
    events = clips.take()
    assert sorted(e.camera for e in events) == ["left", "right"]
    assert {e.header_fields()["frames"] for e in events} == {2}


def test_clip_files_count_in_the_retention_and_close_at_the_end(tmp_path):
    clips = _clips(tmp_path, ClipRule(topic="x", pre_s=1.0, post_s=1.0))
    _frames(clips, "a", range(0, 500, 100))
    clips.message(_message("x/a", "a", 400 * MS))
    clips.close_all()
    (event,) = clips.take()
    assert event.header_fields()["frames"] == 5
    on_disk = sum(p.stat().st_size for p in (tmp_path / "clips").rglob("*.*"))
    assert clips.retention.used == on_disk


class FaceOnTen(Stage):
    """A stand-in detector: one face box on frame 10 of each camera, none on the others."""

    kind = "test_record_clips:FaceOnTen"
    accepts = (Frame,)

    async def run(self, inbox, out) -> None:
        async for frame in inbox:
            n = 1 if frame.seq == 10 else 0
            await out.send(
                Detections(
                    camera=frame.camera,
                    seq=frame.seq,
                    capture_ts_ns=frame.capture_ts_ns,
                    deadline_ns=frame.deadline_ns,
                    boxes=np.zeros((n, 4), np.float32),
                    scores=np.ones(n, np.float32),
                    labels=("face",) * n,
                )
            )


def test_a_clip_is_announced_on_events_with_the_frames_its_folder_holds(tmp_path, write_config):
    path = write_config(
        """
        [[cameras]]
        name = "card"
        url = "synthetic:?width=64&height=48&fps=25"
        [[stages]]
        kind = "capture"
        to = ["faces", "record"]
        [[stages]]
        kind = "test_record_clips:FaceOnTen"
        name = "faces"
        to = ["publish"]
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        frame_meta = false
        inbox = { size = 8, policy = "block" }
        [[stages]]
        kind = "record"
        path = "rec"
        session = "s"
        to = ["publish"]
        inbox = { size = 8, policy = "block" }
        clips = [{ topic = "det/", field = "count", pre_s = 0.1, post_s = 0.1 }]
        """
    )

    async def main():
        pipeline, task = await start(path, duration=2.5)
        sub = await subscriber(pipeline, topic="events")
        got = await receive(sub, until_idle_s=3.0)
        return await task, got

    code, got = asyncio.run(main())
    assert code == 0
    (message,) = [wire.decode(m) for m in got]
    h = message.header
    assert message.topic == "events/card" and h["trigger"] == "det/card" and h["triggers"] == 1
    frames = list(read_frames(tmp_path / "rec" / "s" / h["clip"] / "000001.csv"))
    seqs = [e.seq for e, _ in frames]
    assert 10 in seqs and seqs == list(range(seqs[0], seqs[-1] + 1)) and len(frames) == h["frames"]
    trigger = h["capture_ts"]
    assert all(trigger - 100 * MS <= e.capture_ts_ns <= trigger + 100 * MS for e, _ in frames)
    assert (frames[0][0].capture_ts_ns, frames[-1][0].capture_ts_ns) == (h["start_ts"], h["end_ts"])
