"""File helpers for hot reload: a file's identity stamp, compared to notice it changed."""

from __future__ import annotations

from pathlib import Path


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime ns, size, inode) of a file, None when it cannot be stat'ed; a change in any of
    them (an edit, a rewrite, an atomic replace) means the file must be read again."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
