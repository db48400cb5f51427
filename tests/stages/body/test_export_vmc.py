"""The VMC link received by python-osc's own UDP server on a local port: one bundle a frame
with the root, every mapped HumanBodyBones bone, OK and T; chaining the received local poses
from the root gives the model's posed bone heads and skinning rotations (Unity's axes)."""

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
    for name, anny in HUMANOID:
        b = body_model.bone(anny)
        # OSC floats are float32: ~1e-7 relative per value, summed along the chain
        np.testing.assert_allclose(world_pos[name], s @ posed.poses[b, :, 3], atol=2e-5)
        np.testing.assert_allclose(world_rot[name], s @ posed.transforms[b, :, :3] @ s.T, atol=2e-5)
    np.testing.assert_allclose(root[:3], bones["Hips"][:3], atol=0)
    # the walk faces +x in the world: the avatar's up is Unity's +Y
    assert world_rot["Hips"][1, 1] > 0.9
