"""Message segments (stages/record/message_log.py): records read back byte for byte with their
receive time, a record cut short ends the segment, and inconsistent lengths are an error naming
the file and byte."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import wire
from stages.record.frame_log import RecordingError
from stages.record.message_log import (
    MAGIC,
    MessageSegmentWriter,
    encode_record,
    read_messages,
)


def _messages():
    header = {
        "kind": "det",
        "camera": "a",
        "seq": 3,
        "capture_ts": 1,
        "publish_ts": 2,
        "backend": "none",
        "model": "none",
        "synthetic": False,
    }
    boxes = np.arange(8, dtype=np.float32).reshape(2, 4)
    return [
        (11, wire.encode("det/a", header, [("boxes", boxes)])),
        (12, [b"stats", b"{}"]),
        (15, [b"empty", b""]),
    ]


def _write(tmp_path, messages):
    writer = MessageSegmentWriter(tmp_path / "000001")
    for ts, parts in messages:
        writer.append(encode_record(ts, parts))
    writer.close()
    return writer


def test_records_read_back_byte_for_byte_with_their_receive_time(tmp_path):
    messages = _messages()
    writer = _write(tmp_path, messages)
    got = list(read_messages(writer.path))
    assert [ts for ts, _ in got] == [11, 12, 15]
    assert [parts for _, parts in got] == [[bytes(memoryview(p)) for p in m] for _, m in messages]
    assert writer.bytes == writer.path.stat().st_size
    boxes = wire.decode(got[0][1]).arrays["boxes"]
    assert boxes.tolist() == np.arange(8, dtype=np.float32).reshape(2, 4).tolist()


def test_a_record_cut_short_ends_the_segment_and_the_complete_ones_stay(tmp_path):
    writer = _write(tmp_path, _messages())
    data = writer.path.read_bytes()
    for cut in (1, 5, 20):
        writer.path.write_bytes(data[:-cut])
        assert [ts for ts, _ in read_messages(writer.path)] == [11, 12]


def test_a_record_whose_part_lengths_do_not_add_up_is_an_error_naming_file_and_byte(tmp_path):
    writer = _write(tmp_path, _messages())
    data = bytearray(writer.path.read_bytes())
    data[len(MAGIC) + 16] += 1  # the first part's length, one more than it is
    writer.path.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match=rf"000001\.msgs: byte {len(MAGIC)}: part lengths"):
        list(read_messages(writer.path))


def test_a_file_without_the_magic_line_is_not_a_message_segment(tmp_path):
    path = tmp_path / "000001.msgs"
    path.write_bytes(b"hello")
    with pytest.raises(RecordingError, match="000001.msgs: not a message segment"):
        list(read_messages(path))
