"""Which ANNY point each Sapiens2-308 keypoint the body fit uses stands for (docs/body.md,
"Keypoint map"): the COCO-23 ANNY regresses from its vertices (anny/keypoints.py, the
`coco.pth` weights), and bone heads (joint centres) for the hands' joints.

Every fit point is linear in the bone transforms: point = sum over bones j of T_j a[j], with
a[j] float64 [4] its anchor (keypoint_anchors for a regressed keypoint; (head_j, 1) at its
bone for a head), which the fit's Jacobian (stages/body/fit.py) is built on.
"""

from __future__ import annotations

import numpy as np

from npu.models.sapiens2.keypoints import INDEX
from stages.body.model import AnnyModel, RestBody

_COCO23 = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear",
    "left_shoulder", "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist",
    "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle",
    "left_big_toe", "right_big_toe", "left_small_toe", "right_small_toe",
    "left_heel", "right_heel",
)  # fmt: skip

# Sapiens2's hand base joints -> the head of the ANNY bone that starts there: the thumb's
# carpometacarpal joint (finger1-1), the other fingers' metacarpophalangeal joints (fingerN-1).
_HAND_BASES = (
    ("thumb_third_joint", "finger1-1"),
    ("forefinger_third_joint", "finger2-1"),
    ("middle_finger_third_joint", "finger3-1"),
    ("ring_finger_third_joint", "finger4-1"),
    ("pinky_finger_third_joint", "finger5-1"),
)

# The joints past the base, counted from the fingertip (Sapiens2's <finger>4 is the tip,
# <finger>3 the joint next to it): the thumb's metacarpophalangeal (finger1-2) and
# interphalangeal (finger1-3) joints, the other fingers' proximal (fingerN-2) and distal
# (fingerN-3) interphalangeal joints. The tips have no bone head and are not mapped.
_FINGER_JOINTS = tuple(
    (f"{finger}{k}", f"finger{n}-{k}")
    for n, finger in enumerate(
        ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger"), start=1
    )
    for k in (2, 3)
)

_SIDES = (("left", "L"), ("right", "R"))
# (Sapiens2 name, "coco" | "head", ANNY keypoint label or bone label)
SAPIENS_TO_ANNY: tuple[tuple[str, str, str], ...] = tuple(
    (name, "coco", name) for name in _COCO23
) + tuple(
    (f"{side}_{sapiens}", "head", f"{bone}.{suffix}")
    for side, suffix in _SIDES
    for sapiens, bone in _HAND_BASES
)
# the finger joints, mapped when the fit turns the fingers (FitConfig.fingers)
FINGER_JOINTS_TO_ANNY: tuple[tuple[str, str, str], ...] = tuple(
    (f"{side}_{sapiens}", "head", f"{bone}.{suffix}")
    for side, suffix in _SIDES
    for sapiens, bone in _FINGER_JOINTS
)


class BodyKeypoints:
    """The mapped points for one model (SAPIENS_TO_ANNY, then with fingers
    FINGER_JOINTS_TO_ANNY): sapiens float index [N] into the 308, finger [N] True for the
    finger joints, and per rest body their anchors float64 [N, B, 4]."""

    def __init__(self, model: AnnyModel, fingers: bool = False) -> None:
        self.model = model
        mapping = SAPIENS_TO_ANNY + (FINGER_JOINTS_TO_ANNY if fingers else ())
        self.names = [name for name, _, _ in mapping]
        self.sapiens = np.array([INDEX[name] for name in self.names], dtype=np.int64)
        self.finger = np.arange(len(mapping)) >= len(SAPIENS_TO_ANNY)
        self._coco_rows = [
            (i, model.keypoint_labels.index(label))
            for i, (_, kind, label) in enumerate(mapping)
            if kind == "coco"
        ]
        self._heads = [
            (i, model.bone(label)) for i, (_, kind, label) in enumerate(mapping) if kind == "head"
        ]

    def __len__(self) -> int:
        return len(self.names)

    def anchors(self, rest: RestBody) -> np.ndarray:
        out = np.zeros((len(self.names), self.model.bone_count, 4))
        coco = self.model.keypoint_anchors(rest)
        for i, row in self._coco_rows:
            out[i] = coco[row]
        for i, bone in self._heads:
            out[i, bone, :3] = rest.heads[bone]
            out[i, bone, 3] = 1.0
        return out
