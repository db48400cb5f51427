"""Replay's pacing and order (stages/record/replay.py): on a virtual clock each message waits
exactly its recorded gap (scaled by speed), --fast waits for nothing, a topic filter keeps only
its topics, the session's segments are read in order, and a folder that is no session is an
error naming it."""

from __future__ import annotations

import threading

import pytest

from pipeline.clock import VirtualClock
from stages.record.frame_log import RecordingError
from stages.record.message_log import MessageSegmentWriter, encode_record
from stages.record.replay import messages, replay, session_folder

MS = 1_000_000
RECORDS = [
    (1_000 * MS, [b"det/a", b"{1}"]),
    (1_010 * MS, [b"pose/a", b"{2}", b"\x00\x01"]),
    (1_010 * MS, [b"det/b", b"{3}"]),
    (1_050 * MS, [b"stats", b"{4}"]),
]


def _replay(speed, topics=()):
    clock, sent = VirtualClock(), []
    n = replay(RECORDS, sent.append, threading.Event(), speed, clock, topics)
    return n, sent, clock.waits


def test_each_message_waits_its_recorded_gap():
    n, sent, waits = _replay(1.0)
    assert n == 4 and sent == [parts for _, parts in RECORDS]
    assert waits == pytest.approx([0.010, 0.040])  # no wait for the same receive time


def test_speed_scales_the_gaps_and_fast_waits_for_nothing():
    assert _replay(2.0)[2] == pytest.approx([0.005, 0.020])
    n, sent, waits = _replay(None)
    assert n == 4 and waits == [] and sent == [parts for _, parts in RECORDS]


def test_a_topic_filter_keeps_its_topics_in_order_with_their_gaps():
    n, sent, waits = _replay(1.0, topics=("det/",))
    assert [parts[0] for parts in sent] == [b"det/a", b"det/b"]
    assert waits == pytest.approx([0.010])


def test_a_stop_ends_the_replay_before_the_next_message():
    stop = threading.Event()
    sent = []

    def send(parts):
        sent.append(parts)
        stop.set()

    assert replay(RECORDS, send, stop, 1.0, VirtualClock()) == 1


def test_a_session_is_read_segment_by_segment_in_order(tmp_path):
    folder = tmp_path / "messages"
    folder.mkdir()
    for i, (ts, parts) in enumerate(RECORDS):
        writer = MessageSegmentWriter(folder / f"{i + 1:06d}")
        writer.append(encode_record(ts, parts))
        writer.close()
    assert list(messages(session_folder(tmp_path))) == RECORDS


def test_a_folder_that_is_not_a_session_is_an_error_naming_it(tmp_path):
    with pytest.raises(RecordingError, match=f"{tmp_path}: not a recording session"):
        session_folder(tmp_path)
    with pytest.raises(RecordingError, match="no such recording session folder"):
        session_folder(tmp_path / "missing")
