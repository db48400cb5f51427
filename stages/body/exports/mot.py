"""OpenSim .mot joint angles of a fitted body over time: OpenSim's Storage text format
(opensim-core OpenSim/Common/Storage.cpp: a name line, `version=1`, `nRows`, `nColumns`
(time included), `inDegrees=yes`, `endheader`, a tab-separated label line starting `time`,
then one row per frame).

Columns: `root_tx`, `root_ty`, `root_tz`, the root's (pelvis) position in metres in the
Y-up frame of the .trc files (stages/rig/trc.py's (x, y, z) -> (y, z, x)); `root_rx`,
`root_ry`, `root_rz`, the rotation vector of the root's world rotation in those axes; then
per bone `<bone>_x`, `_y`, `_z` (dots as `_`): the rotation vector of its pose delta in the
bone's own axes (x its main bending axis, y along the bone: twist), the quantity the joint
limits bound (stages/body/limits.py); all angles in degrees.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.errors import NpucamError
from stages.body.exports.axes import points_yup, rotations_yup
from stages.body.fit import FITTED_BONES
from stages.body.model import AnnyModel
from stages.body.rotations import matrix_to_rotvec


class MotError(NpucamError):
    """Inputs the .mot writer cannot write; says which."""


def joint_angles(
    model: AnnyModel,
    rotations: np.ndarray,
    translation: np.ndarray,
    bones: Sequence[str] = FITTED_BONES,
) -> tuple[list[str], np.ndarray]:
    """Column labels (without `time`) and values float64 [T, 6 + 3 len(bones)] (module
    docstring) of rotations [T, B, 3, 3] (local-ref deltas) and translation [T, 3] (m)."""
    rotations = np.asarray(rotations, np.float64)
    translation = np.asarray(translation, np.float64)
    t, b = len(rotations), model.bone_count
    if rotations.shape != (t, b, 3, 3) or translation.shape != (t, 3):
        raise MotError(
            f"rotations must be [T, {b}, 3, 3] and translation [T, 3], got "
            f"{rotations.shape} and {translation.shape}"
        )
    index = [model.bone(name) for name in bones]
    # the root's world rotation (model.py `pose`: U0^T D0 U0)
    u0 = model.reference[0]
    root = matrix_to_rotvec(rotations_yup(u0.T @ rotations[:, 0] @ u0))
    local = matrix_to_rotvec(rotations[:, index].reshape(-1, 3, 3)).reshape(t, len(index), 3)
    in_bone = np.einsum("nji,tnj->tni", model.reference[index], local)
    labels = ["root_tx", "root_ty", "root_tz", "root_rx", "root_ry", "root_rz"] + [
        f"{name.replace('.', '_')}_{axis}" for name in bones for axis in "xyz"
    ]
    values = np.concatenate(
        [points_yup(translation), np.degrees(root), np.degrees(in_bone.reshape(t, -1))], axis=1
    )
    return labels, values


def format_mot(
    times: np.ndarray, labels: Sequence[str], values: np.ndarray, name: str = "body"
) -> str:
    """times [T] s (increasing; written from 0), values [T, C] under labels [C]."""
    times = np.asarray(times, np.float64)
    values = np.asarray(values, np.float64)
    if times.ndim != 1 or not len(times) or not (np.diff(times) > 0).all():
        raise MotError(f"times must be [T] increasing seconds, got {times.shape}")
    if values.shape != (len(times), len(labels)):
        raise MotError(f"values must be [T={len(times)}, {len(labels)}], got {values.shape}")
    bad = [x for x in [name, *labels] if not x or any(c in x for c in " \t\r\n")]
    if bad:
        raise MotError(f"name and labels must be non-empty, without whitespace: {bad[:3]}")
    header = [
        name,
        "version=1",
        f"nRows={len(times)}",
        f"nColumns={len(labels) + 1}",
        "inDegrees=yes",
        "endheader",
        "\t".join(["time", *labels]),
    ]
    table = np.concatenate([(times - times[0])[:, None], values], axis=1)
    rows = ["\t".join(f"{x:.8f}" for x in row) for row in table]
    return "\n".join(header + rows) + "\n"


def write_mot(
    path: str | os.PathLike,
    model: AnnyModel,
    times: np.ndarray,
    rotations: np.ndarray,
    translation: np.ndarray,
    bones: Sequence[str] = FITTED_BONES,
) -> None:
    """One person's joint angles (joint_angles) at times [T] s as a .mot file."""
    path = Path(path)
    labels, values = joint_angles(model, rotations, translation, bones)
    text = format_mot(times, labels, values, name=path.stem or "body")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise MotError(f"{path}: cannot write: {exc.strerror or exc}") from None
