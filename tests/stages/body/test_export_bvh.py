"""The BVH export read back by bvhio (an independent reader: its own hierarchy and forward
kinematics): the joints are ANNY's bones with their parents, and every frame's joint world
positions are the model's posed bone heads (stages/body/model.py `pose`), Y up."""

from __future__ import annotations

import bvhio
import numpy as np
import pytest
from body_scenes import FPS, PHENOTYPE, walk_and_wave

from stages.body import skeleton
from stages.body.exports.bvh import BvhError, write_bvh


def test_bvh_read_back_gives_the_models_joint_positions_every_frame(body_model, tmp_path):
    truth = walk_and_wave(body_model, 8)
    rotations = np.stack([p.rotations for p in truth])
    translation = np.stack([p.translation for p in truth])
    path = tmp_path / "walk.bvh"
    write_bvh(path, body_model, PHENOTYPE, np.arange(8) / FPS, rotations, translation)

    data = bvhio.readAsBvh(str(path))
    assert data.FrameCount == 8
    assert data.FrameTime == pytest.approx(1 / FPS, abs=1e-8)
    root = bvhio.readAsHierarchy(str(path))
    joints = {joint.Name: joint for joint, _, _ in root.layout()}
    assert set(joints) == set(skeleton.NAMES)
    for name, parent in skeleton.BONES[1:]:
        assert joints[name].Parent.Name == parent

    rest = body_model.rest(PHENOTYPE, vertices=False)
    worst = 0.0
    for f in range(8):
        root.loadPose(f)
        got = np.array([list(joints[name].PositionWorld) for name in skeleton.NAMES])
        heads = body_model.pose(rest, rotations[f], translation[f]).poses[:, :, 3]
        worst = max(worst, float(np.abs(got - heads[:, [1, 2, 0]]).max()))
    # the file's 6 decimals (1e-6 m, 1e-6 degree) along chains of up to 13 joints
    assert worst < 2e-5, worst


def test_bvh_times_must_increase(body_model, tmp_path):
    with pytest.raises(BvhError, match="increasing"):
        write_bvh(tmp_path / "x.bvh", body_model, PHENOTYPE, [0.0, 0.0],
                  np.tile(np.eye(3), (2, 104, 1, 1)), np.zeros((2, 3)))  # fmt: skip
