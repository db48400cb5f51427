"""The body forward for the fit on a chosen set of bones ("units"): the root and the bones
the fit turns. The other bones keep their rest pose relative to their parent, so each one's
bone transform is its nearest unit ancestor's times a constant (per rest body), and the
keypoint anchors of a rest body fold onto the units once; each fit step then chains only
the units. Exact: equals AnnyModel.pose (anny/utils/kinematics.py `forward_kinematic`,
"local-ref") whenever the other bones' deltas are the identity.
"""

from __future__ import annotations

import numpy as np

from stages.body.model import AnnyModel, RestBody


def _homogeneous(m34: np.ndarray) -> np.ndarray:
    out = np.zeros(m34.shape[:-2] + (4, 4))
    out[..., :3, :] = m34
    out[..., 3, 3] = 1.0
    return out


def _inverse(m: np.ndarray) -> np.ndarray:
    """Inverse of rigid [..., 4, 4] transforms."""
    out = np.zeros_like(m)
    rt = np.swapaxes(m[..., :3, :3], -1, -2)
    out[..., :3, :3] = rt
    out[..., :3, 3] = -np.einsum("...ij,...j->...i", rt, m[..., :3, 3])
    out[..., 3, 3] = 1.0
    return out


class UnitChain:
    """units: sorted bone indices starting with the root (0). anchors: float64 [N, B, 4]
    (stages/body/keypoint_map.py) for this rest body."""

    def __init__(
        self, model: AnnyModel, rest: RestBody, units: np.ndarray, anchors: np.ndarray
    ) -> None:
        units = np.asarray(units)
        if units[0] != 0 or (np.diff(units) <= 0).any():
            raise ValueError("units must be sorted bone indices starting with the root")
        self.units = units
        b = model.bone_count
        position = {int(u): i for i, u in enumerate(units)}
        owner = np.empty(b, dtype=np.int64)  # each bone's nearest unit ancestor (itself)
        for j in range(b):
            owner[j] = position[j] if j in position else owner[model.parents[j]]
        identity = np.tile(np.eye(3), (b, 1, 1))
        w0 = _homogeneous(model.pose(rest, identity, np.zeros(3)).poses)
        rest_pose = np.zeros((b, 4, 4))
        rest_pose[:, :3, :3] = rest.orientations
        rest_pose[:, :3, 3] = rest.heads
        rest_pose[:, 3, 3] = 1.0
        self.rest_inverse = _inverse(rest_pose[units])[:, :3]  # P_u^-1
        full_parent = model.parent_or_self[units]
        self.unit_parent = np.array([-1] + [owner[p] for p in full_parent[1:]])
        # W_{p(u)} = W_{unit parent} Rel_u, constant while the bones between keep their rest
        self.rel = np.zeros((len(units), 4, 4))
        self.rel[0] = np.eye(4)
        for i in range(1, len(units)):
            up = units[self.unit_parent[i]]
            self.rel[i] = _inverse(w0[up]) @ w0[full_parent[i]]
        u = model.reference
        r, h = rest.orientations, rest.heads
        a = u @ r.transpose(0, 2, 1)
        a[0] = np.eye(3)
        p_all = model.parent_or_self
        q_offsets = np.einsum("bij,bj->bi", a[p_all], h - h[p_all])
        self.u_unit = u[units]
        self.u_parent_t = u[full_parent].transpose(0, 2, 1)
        self.k_trans = np.einsum("bij,bj->bi", self.u_parent_t, q_offsets[units])
        self.u_root_t = u[0].T
        # anchors folded onto the units: T_j = T_a C_j, C_j = P_a W0_a^-1 W0_j P_j^-1
        carry = rest_pose[units][owner] @ _inverse(w0[units])[owner] @ w0 @ _inverse(rest_pose)
        folded = np.zeros((anchors.shape[0], len(units), 4))
        for j in range(b):
            folded[:, owner[j]] += anchors[:, j] @ carry[j].T
        self.anchors = folded
        self.subtree = np.zeros((len(units), len(units)))
        for i in range(len(units)):
            self.subtree[i, i] = 1.0
            k = self.unit_parent[i]
            while k >= 0:
                self.subtree[k, i] = 1.0
                k = self.unit_parent[k]
        self.weight_share = folded[..., 3] @ self.subtree.T  # [N, units]
        depth = np.zeros(len(units), dtype=np.int64)
        for i in range(1, len(units)):
            depth[i] = depth[self.unit_parent[i]] + 1
        # the units below the root by depth: each level's parents are all in earlier ones
        self.levels = [np.nonzero(depth == d)[0] for d in range(1, depth.max() + 1)]

    def forward(
        self, rotations: np.ndarray, translation: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """rotations float64 [units, 3, 3] (local-ref deltas), translation [3] (the root's
        world position). Returns the units' bone transforms T [units, 3, 4], their posed
        world poses W [units, 3, 4] and their full-rig parents' world rotations [units, 3, 3]
        (the root's: identity)."""
        n = len(self.units)
        w = np.empty((n, 4, 4))
        parent_rot = np.empty((n, 3, 3))
        m = rotations @ self.u_unit
        w[0] = 0.0
        w[0, :3, :3] = self.u_root_t @ m[0]
        w[0, :3, 3] = translation
        w[0, 3, 3] = 1.0
        parent_rot[0] = np.eye(3)
        k = np.zeros((n, 4, 4))
        k[:, :3, :3] = self.u_parent_t @ m
        k[:, :3, 3] = self.k_trans
        k[:, 3, 3] = 1.0
        for level in self.levels:
            base = w[self.unit_parent[level]] @ self.rel[level]
            parent_rot[level] = base[:, :3, :3]
            w[level] = base @ k[level]
        transforms = w[:, :3, :3] @ self.rest_inverse
        transforms[:, :, 3] += w[:, :3, 3]
        return transforms, w[:, :3], parent_rot

    def keypoints(self, transforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mapped points [N, 3] and their per-unit terms [N, units, 3]."""
        terms = (transforms[None] * self.anchors[:, :, None, :]).sum(axis=-1)
        return terms.sum(axis=1), terms
