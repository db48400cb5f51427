"""`npucam replay`'s core: a session's message logs in order (segment by segment, record by
record) and their sending on a PUB socket at the recorded pace, scaled by `speed`, or as fast as
the subscribers take them. Pacing waits on a pipeline.clock.Clock, so a test checks the exact
waits on a VirtualClock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from pipeline.clock import SYSTEM, Clock
from stages.record import message_log
from stages.record.frame_log import FRAMES_DIR, RecordingError
from stages.record.message_log import MESSAGES_DIR
from stages.record.segments import segment_stems


def session_folder(path: str | Path) -> Path:
    """A session folder (one the record stage wrote); RecordingError naming it otherwise."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise RecordingError(f"{folder}: no such recording session folder")
    if not (folder / MESSAGES_DIR).is_dir() and not (folder / FRAMES_DIR).is_dir():
        raise RecordingError(f"{folder}: not a recording session (no messages/ or frames/ in it)")
    return folder


def messages(session: Path) -> Iterator[tuple[int, list[bytes]]]:
    """(receive_ts_ns, parts) of every complete recorded message, in the order received."""
    folder = session / MESSAGES_DIR
    for stem in segment_stems(folder, message_log.MESSAGE_SUFFIX):
        yield from message_log.read_messages(stem.with_suffix(message_log.MESSAGE_SUFFIX))


def replay(
    records: Iterable[tuple[int, list[bytes]]],
    send: Callable[[list[bytes]], None],
    stop: threading.Event,
    speed: float | None = 1.0,
    clock: Clock = SYSTEM,
    topics: tuple[str, ...] = (),
) -> int:
    """Send each record's parts, the k-th at start + (ts_k - ts_0) / speed (speed None: at
    once); only topics starting with one of `topics` when given. The count sent; stops early
    when `stop` is set."""
    prefixes = tuple(t.encode() for t in topics)
    first_ts: int | None = None
    start = 0.0
    sent = 0
    for ts, parts in records:
        if prefixes and not bytes(parts[0]).startswith(prefixes):
            continue
        if first_ts is None:  # the clock starts at the first message, once its segment is read
            first_ts, start = ts, clock.monotonic()
        if speed is not None:
            delay = start + (ts - first_ts) / 1e9 / speed - clock.monotonic()
            if delay > 0 and clock.wait(stop, delay):
                break
        if stop.is_set():
            break
        send(parts)
        sent += 1
    return sent
