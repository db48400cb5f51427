"""The glTF export loaded back by pygltflib: one node and mesh per body, its positions the
skinned vertices in Y-up axes (float32), its indices the model's triangles."""

from __future__ import annotations

import numpy as np
import pygltflib
import pytest
from body_scenes import PHENOTYPE, walk_and_wave

from stages.body.exports.gltf import GltfError, write_gltf


def _accessor(gltf: pygltflib.GLTF2, index: int, dtype, width: int) -> np.ndarray:
    accessor = gltf.accessors[index]
    view = gltf.bufferViews[accessor.bufferView]
    blob = gltf.binary_blob()
    start = view.byteOffset + (accessor.byteOffset or 0)
    raw = np.frombuffer(blob, dtype, accessor.count * width, start)
    return raw.reshape(-1, width) if width > 1 else raw


def test_the_glb_holds_each_bodys_skinned_vertices_and_the_triangles(body_model, tmp_path):
    rest = body_model.rest(PHENOTYPE)
    bodies = [
        body_model.skin(rest, body_model.pose(rest, p.rotations, p.translation))
        for p in walk_and_wave(body_model, 2)
    ]
    path = tmp_path / "bodies.glb"
    write_gltf(path, bodies, body_model.triangles, ["first", "second"])

    gltf = pygltflib.GLTF2.load(str(path))
    assert [n.name for n in gltf.nodes] == ["first", "second"]
    assert gltf.scenes[gltf.scene].nodes == [0, 1]
    for node, vertices in zip(gltf.nodes, bodies, strict=True):
        primitive = gltf.meshes[node.mesh].primitives[0]
        assert primitive.mode in (None, pygltflib.TRIANGLES)
        got = _accessor(gltf, primitive.attributes.POSITION, np.float32, 3)
        np.testing.assert_allclose(got, vertices[:, [1, 2, 0]], atol=1e-6)  # float32 at ~1 m
        accessor = gltf.accessors[primitive.attributes.POSITION]
        np.testing.assert_allclose(accessor.min, got.min(axis=0))
        triangles = _accessor(gltf, primitive.indices, np.uint32, 1).reshape(-1, 3)
        np.testing.assert_array_equal(triangles, body_model.triangles)


def test_the_triangles_close_the_body_and_face_outwards(body_model):
    v, t = body_model.template_vertices, body_model.triangles
    edges = np.sort(np.concatenate([t[:, [0, 1]], t[:, [1, 2]], t[:, [2, 0]]]), axis=1)
    _, uses = np.unique(edges, axis=0, return_counts=True)
    assert (uses == 2).all()  # closed and manifold: every edge between two triangles
    # counter-clockwise seen from outside (glTF's front faces) makes the signed volume,
    # sum of a . (b x c) / 6, positive: a human body's, ~0.06 m^3
    volume = np.einsum("ij,ij->i", v[t[:, 0]], np.cross(v[t[:, 1]], v[t[:, 2]])).sum() / 6
    assert 0.03 < volume < 0.15


def test_bad_gltf_inputs_name_what_is_wrong(body_model, tmp_path):
    v = body_model.template_vertices
    with pytest.raises(GltfError, match=r"triangles must be \[T, 3\]"):
        write_gltf(tmp_path / "x.glb", [v], np.zeros((4, 4), int))
    with pytest.raises(GltfError, match="index vertices"):
        write_gltf(tmp_path / "x.glb", [v[:10]], body_model.triangles)
    with pytest.raises(GltfError, match=r"bodies\[0\]: vertices must be finite"):
        write_gltf(tmp_path / "x.glb", [np.full_like(v, np.nan)], body_model.triangles)
