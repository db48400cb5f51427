"""Hot reload of the files a running pipeline reads (the face gallery, CLIP's labels file): a
file's identity stamp, and one watcher that looks at it at most every interval and says
whether it changed or vanished since the last look."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

Change = Literal["changed", "vanished"]


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime ns, size, inode) of a file, None when it cannot be stat'ed; a change in any of
    them (an edit, a rewrite, an atomic replace) means the file must be read again."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class FileWatch:
    """Watches one file: `poll()` stats it at most every interval_s (time.monotonic seconds)
    and returns "changed" when its stamp differs from the last one seen (and it exists),
    "vanished" when it no longer exists, None otherwise (unchanged, or not looked at yet)."""

    def __init__(self, path: Path, interval_s: float = 0.0, now: float | None = None) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.stamp = file_stamp(self.path)
        self.next_check = (time.monotonic() if now is None else now) + interval_s

    def mark(self) -> None:
        """Take the file as it is now as seen (after writing it ourselves)."""
        self.stamp = file_stamp(self.path)

    def poll(self, now: float | None = None) -> Change | None:
        now = time.monotonic() if now is None else now
        if now < self.next_check:
            return None
        self.next_check = now + self.interval_s
        stamp = file_stamp(self.path)
        if stamp == self.stamp:
            return None
        self.stamp = stamp
        return "vanished" if stamp is None else "changed"
