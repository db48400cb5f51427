"""One stream's segments (stages/record/segments.py): a new segment after segment_bytes or
segment_s (on a virtual clock), and a read-only folder: writes refused and counted, one error
logged, a new segment tried after retry_s, recording again once the folder is writable."""

from __future__ import annotations

import logging

from pipeline.clock import VirtualClock
from stages.record.frame_log import FrameSegmentWriter, read_index
from stages.record.retention import Retention
from stages.record.segments import SegmentedLog, segment_stems

SUFFIXES = (".mjpeg", ".csv")


def _log(folder, clock, segment_bytes=10_000, segment_s=60.0, max_bytes=10**6):
    retention = Retention(max_bytes, None)
    log = SegmentedLog(
        folder, FrameSegmentWriter, SUFFIXES, retention, segment_bytes, segment_s, 5.0, clock
    )
    return log, retention


def _frame(log, seq, size=1000):
    return log.write(size + 100, lambda w: w.append(seq, seq * 1000, b"J" * size))


def test_a_new_segment_starts_when_the_next_frame_would_pass_segment_bytes(tmp_path):
    log, _ = _log(tmp_path / "cam", VirtualClock(), segment_bytes=3500)
    for seq in range(7):
        assert _frame(log, seq)
    log.close()
    stems = segment_stems(tmp_path / "cam", ".csv")
    assert [p.name for p in stems] == ["000001", "000002", "000003"]
    seqs = [[e.seq for e in read_index(s.with_suffix(".csv"))] for s in stems]
    assert seqs == [[0, 1, 2], [3, 4, 5], [6]]


def test_a_new_segment_starts_after_segment_s_on_the_clock(tmp_path):
    clock = VirtualClock()
    log, _ = _log(tmp_path / "cam", clock, segment_s=2.0)
    for seq in range(5):
        assert _frame(log, seq)
        clock.advance(0.9)  # frames at 0, 0.9, 1.8 | 2.7, 3.6
    log.close()
    stems = segment_stems(tmp_path / "cam", ".csv")
    assert [[e.seq for e in read_index(s.with_suffix(".csv"))] for s in stems] == [
        [0, 1, 2],
        [3, 4],
    ]


def test_a_later_run_in_the_same_folder_goes_on_numbering(tmp_path):
    for _ in range(2):
        log, _ = _log(tmp_path / "cam", VirtualClock())
        assert _frame(log, 0)
        log.close()
    assert [p.name for p in segment_stems(tmp_path / "cam", ".csv")] == ["000001", "000002"]


def test_a_read_only_folder_refuses_writes_counts_them_and_retries_after_retry_s(
    read_only_dir, caplog
):
    root, make_writable = read_only_dir
    clock = VirtualClock()
    log, retention = _log(root / "cam", clock)
    with caplog.at_level(logging.ERROR):
        results = [_frame(log, seq) for seq in range(3)]
    assert results == [False, False, False] and log.failures == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(root / "cam") in errors[0].getMessage()
    assert retention.used == 0  # nothing reserved stays
    make_writable()
    assert not _frame(log, 3)  # within retry_s of the failure: not tried
    clock.advance(5.0)
    assert _frame(log, 4)
    log.close()
    assert [e.seq for e in read_index(root / "cam" / "000001.csv")] == [4]
