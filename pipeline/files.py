"""The files a running pipeline reads besides its config (the face gallery, CLIP's labels
file): the rules every such read follows (a regular file, no symlink as its last component,
opened without blocking, at most a size cap; docs/security.md), a file's identity stamp, and
one watcher that says whether it changed or vanished since the last look (hot reload)."""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import Literal

from pipeline.errors import NpucamError

Change = Literal["changed", "vanished"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symlink"),
)


class FileRuleError(NpucamError):
    """A file npucam was asked to read that breaks the rules (not a regular file, a symlink,
    over its size cap) or cannot be opened: `path` and `reason`, the message both."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class FileMissingError(FileRuleError):
    """The file does not exist (callers may treat this as "not yet", e.g. a gallery)."""


class FileRefusedError(FileRuleError):
    """The file exists but breaks a rule (a symlink, not a regular file, over its cap): no
    later look will read it as it is, unlike one missing or unreadable for now."""


def kind_of(st: os.stat_result) -> str:
    """What a stat result describes, for messages: "a regular file", "a FIFO (named pipe)"..."""
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")


def path_kind(path: str | Path, follow: bool = True) -> str:
    """What is at path, never raising: "missing", "file", "directory", or a description of
    anything else ("a FIFO (named pipe)", "unreachable: File name too long", ...)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, ENOTDIR, ELOOP, a NUL byte...
        if isinstance(exc, OSError) and exc.errno == errno.ENOTDIR:
            return "missing"
        return f"unreachable: {getattr(exc, 'strerror', None) or exc}"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    return kind_of(st)


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The whole content of path, which must be a regular file of at most max_bytes.

    The rules (docs/security.md): the last component must not be a symlink (O_NOFOLLOW;
    directories on the way may be); anything but a regular file (a FIFO, a device, a
    directory, a socket) is refused before it is opened, and the open itself is
    non-blocking, so a FIFO swapped in between cannot hang the reader; a file over
    max_bytes (by its size, or growing while read) is refused without reading it all.
    FileMissingError when it does not exist, FileRuleError otherwise, naming the file."""
    path = Path(path)
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        raise FileMissingError(path, "no such file") from None
    except (OSError, ValueError) as exc:
        raise FileRuleError(path, f"cannot open: {getattr(exc, 'strerror', None) or exc}") from None
    _check_regular(path, before, max_bytes)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise FileMissingError(path, "no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileRefusedError(path, SYMLINK_REFUSED) from None
        raise FileRuleError(path, f"cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        _check_regular(path, st, max_bytes)  # replaced between lstat and open
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise FileRefusedError(path, f"grew past the {max_bytes}-byte limit while read")
        return b"".join(chunks)
    except OSError as exc:
        raise FileRuleError(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


SYMLINK_REFUSED = (
    "is a symlink; npucam reads this file only as a regular file, never through a symlink "
    "(point the config at the file itself; docs/security.md)"
)


def _check_regular(path: Path, st: os.stat_result, max_bytes: int) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise FileRefusedError(path, SYMLINK_REFUSED)
    if not stat.S_ISREG(st.st_mode):
        raise FileRefusedError(path, f"is {kind_of(st)}, not a regular file")
    if st.st_size > max_bytes:
        raise FileRefusedError(path, f"{st.st_size} bytes, over the {max_bytes}-byte limit")


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime ns, size, inode) of what is at path (a symlink itself, not its target), None
    when it cannot be stat'ed; a change in any of them (an edit, a rewrite, an atomic
    replace, a file swapped for a link or a FIFO) means the file must be read again."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
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
