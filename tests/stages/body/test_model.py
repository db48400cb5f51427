"""The numpy forward against anny's own (test extra), float64. Tolerance 1e-9 m: the issue's
bar. Measured: vertices ~1e-12 m (anny compacts its blendshapes by its own SVD, this module by
the same method in numpy: the bases differ by round-off), keypoints ~1e-14 m."""

from __future__ import annotations

import numpy as np
import pytest
import roma
import torch
from anny.keypoints import KeypointsRegressor

from stages.body.model import BodyModelError, special_procrustes

N = 50


def _random_inputs(rng, n, bones):
    phenotypes = rng.uniform(0.0, 1.0, (n, 6))
    rotvecs = rng.normal(0.0, 0.6, (n, bones, 3))
    rotations = roma.rotvec_to_rotmat(torch.from_numpy(rotvecs)).numpy()
    translations = rng.normal(0.0, 1.0, (n, 3))
    return phenotypes, rotations, translations


def test_vertices_and_keypoints_equal_annys_on_50_random_poses_and_phenotypes(
    body_model, anny_reference
):
    rng = np.random.default_rng(31)
    phenotypes, rotations, translations = _random_inputs(rng, N, body_model.bone_count)
    deltas = np.tile(np.eye(4), (N, body_model.bone_count, 1, 1))
    deltas[:, :, :3, :3] = rotations
    deltas[:, 0, :3, 3] = translations
    regressor = KeypointsRegressor.coco(anny_reference)
    with torch.no_grad():
        out = anny_reference(
            pose_parameters=torch.from_numpy(deltas),
            phenotype_kwargs=torch.from_numpy(phenotypes),
        )
        want_keypoints = regressor(out).numpy()
    want_vertices = out["vertices"].numpy()
    assert anny_reference.bone_labels == body_model.bone_labels
    assert regressor.labels == body_model.keypoint_labels
    worst_vertex = worst_keypoint = worst_fast = 0.0
    for i in range(N):
        rest = body_model.rest(phenotypes[i])
        posed = body_model.pose(rest, rotations[i], translations[i])
        vertices = body_model.skin(rest, posed)
        keypoints = body_model.keypoints_from_vertices(vertices)
        fast = body_model.keypoints(body_model.keypoint_anchors(rest), posed)
        worst_vertex = max(worst_vertex, np.abs(vertices - want_vertices[i]).max())
        worst_keypoint = max(worst_keypoint, np.abs(keypoints - want_keypoints[i]).max())
        worst_fast = max(worst_fast, np.abs(fast - want_keypoints[i]).max())
    assert worst_vertex < 1e-9
    assert worst_keypoint < 1e-9
    assert worst_fast < 1e-9


def test_keypoint_only_rest_needs_no_mesh_and_gives_the_same_keypoints(body_model):
    rng = np.random.default_rng(5)
    phenotypes, rotations, translations = _random_inputs(rng, 1, body_model.bone_count)
    full = body_model.rest(phenotypes[0])
    light = body_model.rest(phenotypes[0], vertices=False)
    posed = body_model.pose(light, rotations[0], translations[0])
    np.testing.assert_allclose(
        body_model.keypoints(body_model.keypoint_anchors(light), posed),
        body_model.keypoints(body_model.keypoint_anchors(full), posed),
        atol=1e-12,
    )
    with pytest.raises(BodyModelError, match="vertices=False"):
        body_model.skin(light, posed)


def test_special_procrustes_equals_romas():
    m = np.random.default_rng(2).normal(size=(200, 3, 3))
    want = roma.special_procrustes(torch.from_numpy(m)).numpy()
    np.testing.assert_allclose(special_procrustes(m), want, atol=1e-12)


def test_bad_shapes_name_what_is_wrong(body_model):
    rest = body_model.rest(np.full(6, 0.5), vertices=False)
    with pytest.raises(BodyModelError, match=r"rotations must be \[104, 3, 3\]"):
        body_model.pose(rest, np.eye(3)[None], np.zeros(3))
    with pytest.raises(BodyModelError, match="phenotype must be"):
        body_model.rest(np.zeros(5))
