"""A folder no file can be created in, for the recording tests (`read_only_dir`: the folder and
a call that makes it writable again): chmod for a normal user; for root (who ignores permission
bits, as on the project's machines and CI), the immutable flag (chattr +i)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def read_only_dir(tmp_path) -> tuple[Path, Callable[[], None]]:
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        yield folder, lambda: folder.chmod(stat.S_IRWXU)
        folder.chmod(stat.S_IRWXU)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)]).returncode != 0:
        pytest.skip("root, and no chattr +i on this filesystem: no read-only folder to test")
    writable = lambda: subprocess.run([chattr, "-i", str(folder)], check=True)  # noqa: E731
    try:
        yield folder, writable
    finally:
        writable()
