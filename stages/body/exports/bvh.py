"""BVH (Biovision Hierarchy) motion of a fitted body: the 104 ANNY bones as joints, each at
its bone's head, parents as the rig's (stages/body/skeleton.py); the root with position and
rotation channels, every other joint with rotations, `Zrotation Xrotation Yrotation` in
degrees (a joint's rotation relative to its parent is Rz Rx Ry, intrinsic, scipy's
`as_euler("ZXY")`); offsets and positions in metres, Y up (the .trc files' axes,
stages/body/exports/axes.py).

A BVH joint's world rotation G_j turns the rest offsets below it; for ANNY that is the
rotation of its skinning transform T_j (stages/body/model.py `pose`: a child's posed head is
T_parent applied to its rest head), so the local rotation written is G_parent^T G_j and the
rest pose (all zeros) is the person's rest body.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from pipeline.errors import NpucamError
from stages.body.exports.axes import points_yup, rotations_yup
from stages.body.model import AnnyModel, RestBody


class BvhError(NpucamError):
    """Inputs the BVH writer cannot write; says which."""


def world_motion(
    model: AnnyModel, rest: RestBody, rotations: np.ndarray, translation: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per frame each bone's world rotation G [T, B, 3, 3] and posed head [T, B, 3], Y up,
    of rotations [T, B, 3, 3] (local-ref deltas) and translation [T, 3] (m)."""
    rotations = np.asarray(rotations, np.float64)
    translation = np.asarray(translation, np.float64)
    t, b = len(rotations), model.bone_count
    if rotations.shape != (t, b, 3, 3) or translation.shape != (t, 3):
        raise BvhError(
            f"rotations must be [T, {b}, 3, 3] and translation [T, 3], got "
            f"{rotations.shape} and {translation.shape}"
        )
    g = np.empty((t, b, 3, 3))
    heads = np.empty((t, b, 3))
    for f in range(t):
        posed = model.pose(rest, rotations[f], translation[f])
        g[f] = posed.transforms[:, :, :3]
        heads[f] = posed.poses[:, :, 3]
    return rotations_yup(g), points_yup(heads)


def format_bvh(
    model: AnnyModel,
    rest: RestBody,
    rotations: np.ndarray,
    translation: np.ndarray,
    frame_time: float,
) -> str:
    """The BVH text of T frames (world_motion's inputs), frame_time seconds apart."""
    if not frame_time > 0:
        raise BvhError(f"frame_time must be > 0 s, got {frame_time}")
    g, heads = world_motion(model, rest, rotations, translation)
    parents = model.parents
    offsets = points_yup(rest.heads - rest.heads[model.parent_or_self])
    offsets[0] = 0.0
    children: list[list[int]] = [[] for _ in parents]
    for j in range(1, len(parents)):
        children[parents[j]].append(j)
    lines = ["HIERARCHY"]

    def joint(j: int, depth: int) -> None:
        pad = "  " * depth
        kind = "ROOT" if j == 0 else "JOINT"
        lines.append(f"{pad}{kind} {model.bone_labels[j]}")
        lines.append(f"{pad}{{")
        lines.append(f"{pad}  OFFSET {_xyz(offsets[j])}")
        channels = "Xposition Yposition Zposition " if j == 0 else ""
        count = 6 if j == 0 else 3
        lines.append(f"{pad}  CHANNELS {count} {channels}Zrotation Xrotation Yrotation")
        for c in children[j]:
            joint(c, depth + 1)
        if not children[j]:
            # an end site half the bone's offset further on (readers need one to draw it)
            tip = 0.5 * offsets[j] if j else np.array([0.0, 0.1, 0.0])
            lines.extend([f"{pad}  End Site", f"{pad}  {{", f"{pad}    OFFSET {_xyz(tip)}",
                          f"{pad}  }}"])  # fmt: skip
        lines.append(f"{pad}}}")

    joint(0, 0)
    t, b = g.shape[:2]
    parent_g = g[:, model.parent_or_self]
    local = np.swapaxes(parent_g, -1, -2) @ g
    local[:, 0] = g[:, 0]
    # the hierarchy's order (depth first) is not the bone order: channels follow it
    order: list[int] = []

    def visit(j: int) -> None:
        order.append(j)
        for c in children[j]:
            visit(c)

    visit(0)
    euler = Rotation.from_matrix(local[:, order].reshape(-1, 3, 3)).as_euler("ZXY", degrees=True)
    euler = euler.reshape(t, b * 3)
    lines += ["MOTION", f"Frames: {t}", f"Frame Time: {frame_time:.8f}"]
    for f in range(t):
        values = np.concatenate([heads[f, 0], euler[f]])
        lines.append(" ".join(f"{x:.6f}" for x in values))
    return "\n".join(lines) + "\n"


def _xyz(v: np.ndarray) -> str:
    return " ".join(f"{x:.6f}" for x in v)


def write_bvh(
    path: str | os.PathLike,
    model: AnnyModel,
    phenotype: np.ndarray,
    times: np.ndarray,
    rotations: np.ndarray,
    translation: np.ndarray,
) -> None:
    """One person's motion at times [T] s (its frame time the median interval; one frame
    needs none: 1/30 s) as a BVH file; phenotype [6] gives the rest skeleton."""
    times = np.asarray(times, np.float64)
    if times.shape != (len(rotations),) or not (np.diff(times) > 0).all():
        raise BvhError(f"times must be [T={len(rotations)}] increasing seconds, got {times.shape}")
    frame_time = float(np.median(np.diff(times))) if len(times) > 1 else 1.0 / 30.0
    rest = model.rest(np.asarray(phenotype, np.float64), vertices=False)
    text = format_bvh(model, rest, rotations, translation, frame_time)
    path = Path(path)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BvhError(f"{path}: cannot write: {exc.strerror or exc}") from None
