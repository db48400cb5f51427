"""A calibration write that fails (issue 33, low finding): `npucam calibrate` on a full disk
left a 0-byte `Calib.toml.tmp` beside the file it could not write. write_calibration (what
calibrate writes through) now removes its temporary file when the write fails; an existing
calibration stays as it was. The full disk is simulated: the write opens its file and then
fails with ENOSPC, as it does on a full filesystem.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from stages.rig.calibration import Calibration, CalibrationError, Camera, write_calibration

CAMERA = Camera(
    "cam0",
    (640, 480),
    np.array([[500.0, 0, 320], [0, 500, 240], [0, 0, 1]]),
    np.zeros(5),
    np.zeros(3),
    np.zeros(3),
)


def test_a_failed_calibration_write_leaves_no_temp_file_and_the_old_file_intact(
    tmp_path, monkeypatch
):
    path = tmp_path / "Calib.toml"
    write_calibration(path, Calibration({"cam_01": CAMERA}))
    before = path.read_bytes()

    def full_disk(self: Path, text: str, encoding: str | None = None) -> int:
        with open(self, "w", encoding=encoding):  # created, as open(2) does on a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(CalibrationError, match=r"Calib\.toml: cannot write: No space left"):
        write_calibration(path, Calibration({"cam_01": CAMERA}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Calib.toml"]
    assert path.read_bytes() == before
