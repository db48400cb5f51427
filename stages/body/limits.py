"""Joint limits of the fitted ANNY bones: a box per bone on the rotation vector of its pose
delta in the bone's own reference axes (anny's "local-bone" frame: y along the bone, x the
main bending axis, z the other; `reference_orientations` in the model data). Ranges are
coarse anatomical ones (degrees), documented in docs/body.md, "Joint limits".

A delta D in the fit's world-aligned "local-ref" axes is U D' U^T with D' the bone-frame
delta (anny/utils/kinematics.py `forward_kinematic`), so its rotation vector is U phi'.
"""

from __future__ import annotations

import numpy as np

from stages.body.rotations import matrix_to_rotvec, rotvec_to_matrix

# bone (without .L/.R) -> ((x lo, x hi), (y lo, y hi), (z lo, z hi)) degrees, bone frame
# (0, 0) locks an axis: the knee is a hinge (flexion), the elbow flexion and pronation, the
# wrist bends without twist (the forearm pronates)
LIMITS_DEG: dict[str, tuple[tuple[float, float], ...]] = {
    "spine03": ((-30, 60), (-40, 40), (-35, 35)),
    "head": ((-50, 50), (-70, 70), (-35, 35)),
    "clavicle": ((-20, 20), (-20, 20), (-20, 20)),
    "upperarm01": ((-120, 170), (-100, 100), (-170, 170)),
    "lowerarm01": ((-10, 160), (-90, 90), (0, 0)),
    "wrist": ((-80, 80), (0, 0), (-45, 45)),
    "upperleg01": ((-130, 35), (-50, 50), (-50, 50)),
    "lowerleg01": ((-5, 155), (0, 0), (0, 0)),
    "foot": ((-50, 35), (-25, 25), (-35, 35)),
    # fingers 2-5 flex about +x (their rest curl's axis), spread about z, no twist; the
    # thumb's carpometacarpal joint turns about x and z, its metacarpophalangeal about z
    # (+z flexes the right thumb, -z the left: the range is symmetric)
    "finger1-1": ((-30, 30), (0, 0), (-45, 45)),
    "finger1-2": ((0, 0), (0, 0), (-70, 70)),
    **{f"finger{n}-1": ((-30, 90), (0, 0), (-25, 25)) for n in range(2, 6)},
    **{f"finger{n}-2": ((-5, 110), (0, 0), (0, 0)) for n in range(2, 6)},
}


def bone_kind(label: str) -> str:
    return label.split(".")[0]


class JointLimits:
    """Box limits for the given bones (indices into the rig; bones with no entry in
    LIMITS_DEG, e.g. the root, are free). reference: float64 [B, 3, 3] (model data)."""

    def __init__(self, labels: list[str], bones: np.ndarray, reference: np.ndarray) -> None:
        self.bones = np.asarray(bones)
        lo = np.full((len(bones), 3), -np.inf)
        hi = np.full((len(bones), 3), np.inf)
        for i, bone in enumerate(self.bones):
            box = LIMITS_DEG.get(bone_kind(labels[bone]))
            if box is not None:
                lo[i], hi[i] = np.radians(np.array(box)).T
        self.lo, self.hi = lo, hi
        self.limited = np.isfinite(lo).all(axis=1)
        self.frames = reference[self.bones]
        self.free = ~((lo == 0.0) & (hi == 0.0))  # [n, 3] the axes the fit may turn

    def free_axes(self) -> np.ndarray:
        """[3 n, f] world-aligned rotation axes of the free (bone, axis) pairs: a step s [f]
        turns bone i by the rotation vector (axes @ s)[3 i : 3 i + 3] (local-ref)."""
        n = len(self.bones)
        columns = []
        for i in range(n):
            for k in np.nonzero(self.free[i])[0]:
                column = np.zeros(3 * n)
                column[3 * i : 3 * i + 3] = self.frames[i][:, k]
                columns.append(column)
        return np.stack(columns, axis=1)

    def bone_frame_rotvecs(self, rotations: np.ndarray) -> np.ndarray:
        """[n, 3] rotation vectors of the deltas [n, 3, 3] (local-ref) in the bones' frames."""
        phi = matrix_to_rotvec(rotations)
        return np.einsum("nji,nj->ni", self.frames, phi)

    def violation(self, rotations: np.ndarray) -> np.ndarray:
        """[n, 3] radians outside the box (0 inside)."""
        phi = self.bone_frame_rotvecs(rotations)
        return np.maximum(self.lo - phi, 0.0) + np.maximum(phi - self.hi, 0.0)

    def clamp(self, rotations: np.ndarray) -> np.ndarray:
        """The deltas [n, 3, 3] with each limited bone's bone-frame rotation vector clipped to
        its box."""
        phi = self.bone_frame_rotvecs(rotations)
        clipped = np.clip(phi, self.lo, self.hi)
        moved = self.limited & (clipped != phi).any(axis=1)
        if not moved.any():
            return rotations
        out = rotations.copy()
        world = np.einsum("nij,nj->ni", self.frames[moved], clipped[moved])
        out[moved] = rotvec_to_matrix(world)
        return out
