"""Segments of published messages: the multipart messages exactly as the publish stage sent
them (docs/protocol.md), each with the time the recorder received it. A segment is the magic
line then records, each written with one unbuffered write:

    u32 record length (what follows) | u64 receive_ts_ns | u32 part count | u32 part lengths...
    | the parts' bytes, back to back          (little-endian)

A process killed mid-write leaves a record shorter than its length: the reader stops there."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from stages.record.frame_log import RecordingError, _write_all

MESSAGES_DIR = "messages"  # a session's messages/NNNNNN.msgs
MESSAGE_SUFFIX = ".msgs"
MAGIC = b"npucam-messages 1\n"
_HEAD = struct.Struct("<IQI")  # record length, receive_ts_ns, part count
_LENGTH = struct.Struct("<I")


def encode_record(receive_ts_ns: int, parts: Sequence[bytes | memoryview]) -> bytes:
    """One record's bytes."""
    lengths = [memoryview(p).nbytes for p in parts]
    body = 12 + 4 * len(parts) + sum(lengths)
    head = _HEAD.pack(body, receive_ts_ns, len(parts))
    return b"".join([head, struct.pack(f"<{len(parts)}I", *lengths), *parts])


class MessageSegmentWriter:
    """Appends records to `<stem>.msgs`; OSError from a full or read-only disk goes to the
    caller."""

    def __init__(self, stem: Path) -> None:
        self.path = stem.with_suffix(MESSAGE_SUFFIX)
        self._file = open(self.path, "xb", buffering=0)  # noqa: SIM115 (kept open)
        try:
            _write_all(self._file, MAGIC)
        except OSError:
            self._file.close()
            raise
        self.messages = 0
        self.bytes = len(MAGIC)

    def append(self, record: bytes) -> int:
        """Write one record (encode_record's); the bytes it added."""
        _write_all(self._file, record)
        self.messages += 1
        self.bytes += len(record)
        return len(record)

    def close(self) -> None:
        self._file.close()


def read_messages(path: Path) -> Iterator[tuple[int, list[bytes]]]:
    """(receive_ts_ns, parts) of every complete record of a segment, in order, read record by
    record (a segment is never all in memory, and a replay never waits on a whole file)."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise RecordingError(f"{path}: not a message segment (expected {MAGIC!r} at byte 0)")
        at = len(MAGIC)
        while len(head := f.read(4)) == 4:
            (body,) = _LENGTH.unpack(head)
            data = f.read(body)
            if len(data) < body:
                return  # the record being written when the process stopped
            yield _record(path, at, head + data)
            at += 4 + body


def _record(path: Path, at: int, data: bytes) -> tuple[int, list[bytes]]:
    """One whole record's (receive_ts_ns, parts); `at` its byte offset, for errors."""
    body, ts, count = _HEAD.unpack_from(data)
    if body < 12 + 4 * count:
        raise RecordingError(f"{path}: byte {at}: record of {count} parts in {body} bytes")
    lengths = struct.unpack_from(f"<{count}I", data, 16)
    if 12 + 4 * count + sum(lengths) != body:
        raise RecordingError(f"{path}: byte {at}: part lengths do not add up to the record")
    start = 16 + 4 * count
    parts = []
    for n in lengths:
        parts.append(data[start : start + n])
        start += n
    return ts, parts
