"""The fit's folded forward against the full rig's, and its analytic Jacobian against
finite differences."""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from stages.body.chain import UnitChain
from stages.body.fit import FitConfig, Pose, PoseSolver
from stages.body.keypoint_map import BodyKeypoints


def _random_pose(rng, model, bones) -> Pose:
    rotations = np.tile(np.eye(3), (model.bone_count, 1, 1))
    rotations[bones] = Rotation.from_rotvec(rng.normal(0.0, 0.5, (len(bones), 3))).as_matrix()
    return Pose(rotations, rng.normal(0.0, 1.0, 3))


def test_folded_units_give_the_full_rigs_points_poses_and_parent_rotations(body_model):
    rng = np.random.default_rng(4)
    points = BodyKeypoints(body_model)
    rest = body_model.rest(rng.uniform(0.0, 1.0, 6), vertices=False)
    anchors = points.anchors(rest)
    solver = PoseSolver(body_model, points, FitConfig())
    chain = UnitChain(body_model, rest, solver.bones, anchors)
    for _ in range(5):
        pose = _random_pose(rng, body_model, solver.bones)
        posed = body_model.pose(rest, pose.rotations, body_model.reference[0] @ pose.translation)
        transforms, poses, parent_rot = chain.forward(
            pose.rotations[solver.bones], pose.translation
        )
        got, _ = chain.keypoints(transforms)
        want = np.einsum("bij,nbj->ni", posed.transforms, anchors)
        np.testing.assert_allclose(got, want, atol=1e-12)
        np.testing.assert_allclose(poses, posed.poses[solver.bones], atol=1e-12)
        parents = body_model.parent_or_self[solver.bones[1:]]
        np.testing.assert_allclose(parent_rot[1:], posed.poses[parents, :, :3], atol=1e-12)


def test_the_analytic_jacobian_equals_finite_differences(body_model):
    rng = np.random.default_rng(6)
    points = BodyKeypoints(body_model)
    solver = PoseSolver(body_model, points, FitConfig())
    solver.set_rest(body_model.rest(rng.uniform(0.0, 1.0, 6), vertices=False))
    pose = _random_pose(rng, body_model, solver.bones)
    p0, terms, posed = solver.keypoints(pose)
    jac = solver.jacobian(terms, posed).reshape(3 * len(points), -1)
    eps = 1e-6
    numeric = np.empty_like(jac)
    for k in range(jac.shape[1]):
        step = np.zeros(jac.shape[1])
        step[k] = eps
        moved = pose.copy()
        moved.translation = pose.translation + step[:3]
        turns = Rotation.from_rotvec(step[3:].reshape(-1, 3)).as_matrix()
        moved.rotations[solver.bones] = turns @ pose.rotations[solver.bones]
        numeric[:, k] = (solver.keypoints(moved)[0] - p0).ravel() / eps
    # forward differences: error ~ eps x curvature (<= ~1 m of lever arm)
    np.testing.assert_allclose(jac, numeric, atol=2e-6)
