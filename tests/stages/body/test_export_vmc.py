"""The VMC link received by python-osc's own UDP server on a local port: one bundle a frame
with the root, every mapped HumanBodyBones bone, OK and T; chaining the received local poses
from the root gives the model's posed bone heads and skinning rotations (Unity's axes), the
arms' turned from a VRM's T-pose to ANNY's rest arms."""

from __future__ import annotations

import numpy as np
from body_scenes import PHENOTYPE, walk_and_wave
from scipy.spatial.transform import Rotation
from vmc_receiver import Receiver

from stages.body.exports.vmc import HUMANOID, UNITY_FROM_WORLD, VmcPose, VmcSender


def test_vmc_bundles_reach_a_python_osc_server_with_every_bone(body_model):
    pose = walk_and_wave(body_model, 1)[0]
    rest = body_model.rest(PHENOTYPE, vertices=False)
    receiver = Receiver()
    try:
        sender = VmcSender(body_model, "127.0.0.1", receiver.port)
        sender.send(rest, pose.rotations, pose.translation, 12.5)
        got = receiver.wait_for(len(HUMANOID) + 3)
    finally:
        receiver.close()
    assert sender.sent == 1
    addresses = [a for a, _ in got]
    assert addresses.count("/VMC/Ext/Bone/Pos") == len(HUMANOID)
    assert {a for a in addresses} == {
        "/VMC/Ext/Root/Pos", "/VMC/Ext/Bone/Pos", "/VMC/Ext/OK", "/VMC/Ext/T"
    }  # fmt: skip
    bones = {
        args[0]: np.array(args[1:], dtype=np.float64) for a, args in got if a.endswith("Bone/Pos")
    }
    assert set(bones) == {name for name, _ in HUMANOID}
    assert dict(got)["/VMC/Ext/OK"] == (1,)
    assert dict(got)["/VMC/Ext/T"][0] == 12.5
    root = np.array(dict(got)["/VMC/Ext/Root/Pos"][1:], dtype=np.float64)
    assert dict(got)["/VMC/Ext/Root/Pos"][0] == "root"

    # chain the received local poses down the humanoid hierarchy
    mapped = VmcPose(body_model)
    world_rot, world_pos = {}, {}
    for i, name in enumerate(mapped.names):
        p, q = bones[name][:3], Rotation.from_quat(bones[name][3:]).as_matrix()
        if i == 0:
            world_rot[name], world_pos[name] = q, p
        else:
            parent = mapped.names[mapped.parent[i]]
            world_rot[name] = world_rot[parent] @ q
            world_pos[name] = world_pos[parent] + world_rot[parent] @ p
    posed = body_model.pose(rest, pose.rotations, pose.translation)
    s = UNITY_FROM_WORLD
    turns = mapped.t_pose_turns(rest)
    for i, (name, anny) in enumerate(HUMANOID):
        b = body_model.bone(anny)
        # OSC floats are float32: ~1e-7 relative per value, summed along the chain
        np.testing.assert_allclose(world_pos[name], s @ posed.poses[b, :, 3], atol=2e-5)
        want = s @ posed.transforms[b, :, :3] @ s.T @ turns[i]
        np.testing.assert_allclose(world_rot[name], want, atol=2e-5)
    np.testing.assert_allclose(root[:3], bones["Hips"][:3], atol=0)
    # the walk faces +x in the world: the avatar's up is Unity's +Y
    assert world_rot["Hips"][1, 1] > 0.9


ARM_BONES = [
    f"{side}{bone}"
    for side in ("Left", "Right")
    for bone in ("UpperArm", "LowerArm", "Hand")
    + tuple(f"{f}{j}" for f in ("Thumb", "Index", "Middle", "Ring", "Little")
            for j in ("Proximal", "Intermediate", "Distal"))
]  # fmt: skip


def test_the_arms_turn_from_a_t_pose_onto_annys_rest_arms(body_model):
    """The turn each mapped bone's rotation carries (the first test chains it): identity off
    the arms; on each arm, from the shoulder's child down to the fingertips, the one turn that
    takes the T-pose arm (Unity -X left, +X right) onto ANNY's rest arm, which hangs below
    the shoulder and points away from the body, so a T-posed avatar shows ANNY's rest arms."""
    rest = body_model.rest(PHENOTYPE, vertices=False)
    mapped = VmcPose(body_model)
    turns = dict(zip(mapped.names, mapped.t_pose_turns(rest), strict=True))
    s = UNITY_FROM_WORLD
    for side, sign, letter in (("Left", -1.0, "L"), ("Right", 1.0, "R")):
        heads = rest.heads[[body_model.bone(f"{b}.{letter}") for b in ("upperarm01", "lowerarm01")]]
        arm = s @ (heads[1] - heads[0])
        arm /= np.linalg.norm(arm)
        turn = turns[f"{side}UpperArm"]
        np.testing.assert_allclose(turn @ np.array([sign, 0.0, 0.0]), arm, atol=1e-12)
        np.testing.assert_allclose(turn @ turn.T, np.eye(3), atol=1e-12)
        assert arm[1] < -0.5 and arm[0] * sign > 0.5  # below the shoulder, away from the body
        below = [n for n in ARM_BONES if n.startswith(side)]
        assert len(below) == 3 + 15  # upper arm, lower arm, hand and the 15 finger bones
        for name in below:
            np.testing.assert_array_equal(turns[name], turn, err_msg=name)
    for name in set(mapped.names) - set(ARM_BONES):
        np.testing.assert_array_equal(turns[name], np.eye(3), err_msg=name)
