"""The VMC protocol (Virtual Motion Capture, OSC over UDP) from a fitted body: what a
"Performer" sends a "Marionette" (VSeeFace, EVMC4U in Unity, VMC4B in Blender) each frame,
through python-osc (optional extra `export`): `/VMC/Ext/Root/Pos "root" px py pz qx qy qz qw`,
one `/VMC/Ext/Bone/Pos <HumanBodyBones name> px py pz qx qy qz qw` per mapped bone (its pose
relative to its mapped parent), `/VMC/Ext/OK 1` and `/VMC/Ext/T <seconds>`, as one OSC bundle
(the protocol's Marionette specification, protocol.vmc.info, v2.0 messages).

Axes: Unity's (left-handed, Y up, the avatar facing +Z, its left at -X) from npucam's world
(right-handed, Z up; ANNY's rest body faces -Y with its left at +X): (x, y, z) -> (-x, z, -y).
Rotations are those of the bones' skinning transforms in world-aligned axes, as a VRM's
normalised bones, whose identity is a T-pose: ANNY's rest arms hang ~45 degrees below it, so
each arm's bones (the upper arm and all below it) also carry the turn from the T-pose's arm
(along Unity's -X on the left, +X on the right) to that rest arm (docs/body.md, "VMC").
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from pipeline.errors import NpucamError
from stages.body.model import AnnyModel, RestBody

DEFAULT_PORT = 39539  # a Marionette's usual receive port (the protocol's)

# Unity's HumanBodyBones names -> the ANNY bone there
HUMANOID: tuple[tuple[str, str], ...] = (
    ("Hips", "root"), ("Spine", "spine05"), ("Chest", "spine03"), ("UpperChest", "spine01"),
    ("Neck", "neck01"), ("Head", "head"), ("LeftEye", "eye.L"), ("RightEye", "eye.R"),
) + tuple(
    (f"{side}{unity}", f"{anny}.{suffix}")
    for side, suffix in (("Left", "L"), ("Right", "R"))
    for unity, anny in (
        ("UpperLeg", "upperleg01"), ("LowerLeg", "lowerleg01"), ("Foot", "foot"),
        ("Toes", "toe1-1"), ("Shoulder", "clavicle"), ("UpperArm", "upperarm01"),
        ("LowerArm", "lowerarm01"), ("Hand", "wrist"),
        ("ThumbProximal", "finger1-1"), ("ThumbIntermediate", "finger1-2"),
        ("ThumbDistal", "finger1-3"), ("IndexProximal", "finger2-1"),
        ("IndexIntermediate", "finger2-2"), ("IndexDistal", "finger2-3"),
        ("MiddleProximal", "finger3-1"), ("MiddleIntermediate", "finger3-2"),
        ("MiddleDistal", "finger3-3"), ("RingProximal", "finger4-1"),
        ("RingIntermediate", "finger4-2"), ("RingDistal", "finger4-3"),
        ("LittleProximal", "finger5-1"), ("LittleIntermediate", "finger5-2"),
        ("LittleDistal", "finger5-3"),
    )
)  # fmt: skip

UNITY_FROM_WORLD = np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


class VmcError(NpucamError):
    """A VMC link that cannot be made or fed; says which."""


class VmcPose:
    """The mapped bones of a model and each one's mapped parent (the nearest mapped ancestor)."""

    def __init__(self, model: AnnyModel) -> None:
        self.model = model
        self.names = [unity for unity, _ in HUMANOID]
        self.bones = np.array([model.bone(anny) for _, anny in HUMANOID])
        row = {int(b): i for i, b in enumerate(self.bones)}
        parent = []
        for b in self.bones[1:]:
            a = int(model.parents[b])
            while a not in row:
                a = int(model.parents[a])
            parent.append(row[a])
        self.parent = np.array([0, *parent])
        # each mapped bone's arm: +1 left, -1 right (the T-pose arm along Unity's -X, +X), 0
        self.arm = np.zeros(len(self.bones), dtype=np.int64)
        for side, sign in (("L", 1), ("R", -1)):
            upper = model.bone(f"upperarm01.{side}")
            self.arm[[_descends(model, int(b), upper) for b in self.bones]] = sign
        self.upper = {1: model.bone("upperarm01.L"), -1: model.bone("upperarm01.R")}
        self.lower = {1: model.bone("lowerarm01.L"), -1: model.bone("lowerarm01.R")}

    def t_pose_turns(self, rest: RestBody) -> np.ndarray:
        """[N, 3, 3] (Unity axes) per mapped bone: the turn taking the T-pose's arm onto `rest`'s
        (the upper arm's head to the forearm's), identity off the arms."""
        turns = np.tile(np.eye(3), (len(self.bones), 1, 1))
        for sign in (1, -1):
            arm = UNITY_FROM_WORLD @ (rest.heads[self.lower[sign]] - rest.heads[self.upper[sign]])
            t_arm = np.array([-float(sign), 0.0, 0.0])
            axis = np.cross(t_arm, arm / np.linalg.norm(arm))
            angle = np.arctan2(np.linalg.norm(axis), float(t_arm @ arm) / np.linalg.norm(arm))
            turn = Rotation.from_rotvec(axis / np.linalg.norm(axis) * angle).as_matrix()
            turns[self.arm == sign] = turn
        return turns

    def messages(
        self, rest: RestBody, rotations: np.ndarray, translation: np.ndarray, time_s: float
    ) -> list[tuple[str, list]]:
        """The (OSC address, arguments) of one frame (module docstring): rotations [B, 3, 3]
        (local-ref deltas), translation [3] (m)."""
        posed = self.model.pose(rest, rotations, translation)
        s = UNITY_FROM_WORLD
        g = s @ posed.transforms[self.bones, :, :3] @ s.T @ self.t_pose_turns(rest)
        heads = posed.poses[self.bones, :, 3] @ s.T
        local = np.swapaxes(g[self.parent], -1, -2) @ g
        local[0] = g[0]
        offsets = np.einsum("nji,nj->ni", g[self.parent], heads - heads[self.parent])
        offsets[0] = heads[0]
        quats = Rotation.from_matrix(local).as_quat()  # x, y, z, w
        out: list[tuple[str, list]] = [
            ("/VMC/Ext/Root/Pos", ["root", *map(float, heads[0]), *map(float, quats[0])])
        ]
        for i, name in enumerate(self.names):
            out.append(("/VMC/Ext/Bone/Pos", [name, *map(float, offsets[i]),
                                              *map(float, quats[i])]))  # fmt: skip
        out += [("/VMC/Ext/OK", [1]), ("/VMC/Ext/T", [float(time_s)])]
        return out


def _descends(model: AnnyModel, bone: int, ancestor: int) -> bool:
    """Whether `bone` is `ancestor` or below it."""
    while bone >= 0:
        if bone == ancestor:
            return True
        bone = int(model.parents[bone])
    return False


class VmcSender:
    """Sends each frame's VmcPose.messages as one OSC bundle to host:port over UDP."""

    def __init__(self, model: AnnyModel, host: str, port: int = DEFAULT_PORT) -> None:
        try:
            from pythonosc.udp_client import SimpleUDPClient
        except ImportError:
            raise VmcError(
                "the VMC link needs python-osc: pip install 'npucam[export]' (pyproject.toml)"
            ) from None
        self.pose = VmcPose(model)
        self.target = (host, port)
        try:
            self.client = SimpleUDPClient(host, port)
        except OSError as exc:
            raise VmcError(f"vmc {host}:{port}: {exc}") from None
        self.sent = 0

    def send(
        self, rest: RestBody, rotations: np.ndarray, translation: np.ndarray, time_s: float
    ) -> None:
        from pythonosc.osc_bundle_builder import IMMEDIATELY, OscBundleBuilder
        from pythonosc.osc_message_builder import OscMessageBuilder

        bundle = OscBundleBuilder(IMMEDIATELY)
        for address, args in self.pose.messages(rest, rotations, translation, time_s):
            message = OscMessageBuilder(address=address)
            for arg in args:
                message.add_arg(arg)
            bundle.add_content(message.build())
        try:
            self.client.send(bundle.build())
        except OSError as exc:
            raise VmcError(f"vmc {self.target[0]}:{self.target[1]}: {exc}") from None
        self.sent += 1
