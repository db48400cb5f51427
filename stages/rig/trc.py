"""OpenSim .trc marker files of a recorded person: the header and rows Pose2Sim's make_trc
writes (tab-separated, 5 header lines, Frame# from 1, Time in s, X Y Z per marker in m,
missing values blank), with its Z-up -> Y-up axis change (x, y, z) -> (y, z, x).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npu.models.sapiens2 import keypoints as keypoints308
from pipeline.errors import NpucamError


class TrcError(NpucamError):
    """A trajectory the .trc writer cannot write; says what is wrong."""


def format_trc(
    points: np.ndarray,
    times: np.ndarray,
    names: Sequence[str] | None = None,
    rate: float | None = None,
    file_name: str = "pose3d.trc",
    zup_to_yup: bool = True,
) -> str:
    """points: float [T, M, 3] world (m, NaN = missing), times: float [T] s (increasing);
    names: M marker names (default: the 308 Sapiens2 keypoints); rate: Hz (default: from the
    median interval of times)."""
    points = np.asarray(points, dtype=np.float64)
    times = np.asarray(times, dtype=np.float64)
    names = keypoints308.NAMES if names is None else tuple(names)
    if points.ndim != 3 or points.shape[2] != 3 or points.shape[1] != len(names):
        raise TrcError(
            f"points must be [T, M={len(names)}, 3] for {len(names)} names, got {points.shape}"
        )
    if times.shape != (len(points),) or not len(times) or not (np.diff(times) > 0).all():
        raise TrcError(f"times must be [T={len(points)}] increasing seconds, got {times.shape}")
    bad = [n for n in names if not n or any(c in n for c in "\t\r\n")]
    if bad:
        raise TrcError(f"marker names must be non-empty, without tabs or newlines: {bad[:3]}")
    if rate is None:
        if len(times) < 2:
            raise TrcError("one frame: give its rate")
        rate = float(1.0 / np.median(np.diff(times)))
    if zup_to_yup:
        points = points[..., [1, 2, 0]]
    n_frames, n_markers = points.shape[:2]
    header = [
        f"PathFileType\t4\t(X/Y/Z)\t{file_name}",
        "DataRate\tCameraRate\tNumFrames\tNumMarkers\tUnits\tOrigDataRate\tOrigDataStartFrame"
        "\tOrigNumFrames",
        "\t".join(map(str, [rate, rate, n_frames, n_markers, "m", rate, 1, n_frames])),
        "Frame#\tTime\t" + "\t\t\t".join(names) + "\t\t",
        "\t\t" + "\t".join(f"X{i}\tY{i}\tZ{i}" for i in range(1, n_markers + 1)),
    ]
    values = np.char.mod("%.6f", points.reshape(n_frames, -1))
    values[np.isnan(points.reshape(n_frames, -1))] = ""
    rows = [
        f"{f + 1}\t{t:.6f}\t" + "\t".join(row)
        for f, (t, row) in enumerate(zip(times - times[0], values, strict=True))
    ]
    return "\n".join(header + rows) + "\n"


def write_trc(path: str | os.PathLike, points: np.ndarray, times: np.ndarray, **kwargs) -> None:
    """Write format_trc(points, times, file_name=the path's name, **kwargs) to path."""
    path = Path(path)
    text = format_trc(points, times, file_name=path.name, **kwargs)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise TrcError(f"{path}: cannot write: {exc.strerror or exc}") from None
