"""Which of Sapiens2's 308 keypoints move with which body part, and the per-frame CPU landmarks
that measure each part's motion (the anchors KeyframeFusion fits a similarity to).

Anchor array layout (ANCHORS): BlazePose's 33 body landmarks, then MediaPipe's 21 left-hand and
21 right-hand landmarks, then the 468 face-mesh points; NaN where a model did not run or found
nothing. Every one of the 308 keypoints belongs to exactly one part.
"""

from __future__ import annotations

import numpy as np

from npu.models.sapiens2.keypoints import INDEX, NAMES
from stages.landmarks.fusion import Part

LEFT_HAND0, RIGHT_HAND0, FACE0 = 33, 54, 75
NUM_ANCHORS = FACE0 + 468


def anchor_points(
    body_xy: np.ndarray | None,
    left_hand: np.ndarray | None = None,
    right_hand: np.ndarray | None = None,
    face: np.ndarray | None = None,
) -> np.ndarray:
    """float64 [NUM_ANCHORS, 2] in the layout above (NaN for a missing block)."""
    out = np.full((NUM_ANCHORS, 2), np.nan)
    for start, block, n in (
        (0, body_xy, 33),
        (LEFT_HAND0, left_hand, 21),
        (RIGHT_HAND0, right_hand, 21),
        (FACE0, face, 468),
    ):
        if block is not None:
            out[start : start + n] = np.asarray(block, np.float64).reshape(n, 2)
    return out


def _idx(*names: str) -> tuple[int, ...]:
    return tuple(INDEX[n] for n in names)


def _side_hand(side: str) -> tuple[int, ...]:
    return tuple(i for i, n in enumerate(NAMES) if n.startswith(f"{side}_") and _is_hand(n))


def _is_hand(name: str) -> bool:
    return name.endswith("_wrist") or any(
        f in name for f in ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")
    )


def sapiens308_parts() -> tuple[Part, ...]:
    """The parts of the 308 layout: head (the face and the body's face points), torso, each
    arm (the elbow's points, moved by shoulder, elbow and wrist), each leg (the knee), each
    foot, each hand."""
    body = tuple(range(33))
    hand_l, hand_r = _side_hand("left"), _side_hand("right")
    head_body = _idx("nose", "left_eye", "right_eye", "left_ear", "right_ear")
    face = tuple(range(70, 308))
    parts = (
        Part("head", head_body + face, (tuple(range(FACE0, FACE0 + 468)), body[:11])),
        Part(
            "torso",
            _idx("left_shoulder", "right_shoulder", "left_hip", "right_hip", "neck")
            + _idx("left_acromion", "right_acromion"),
            ((11, 12, 23, 24),),
        ),
        Part(
            "left_arm",
            _idx("left_elbow", "left_olecranon", "left_cubital_fossa"),
            ((11, 13, 15),),
        ),
        Part(
            "right_arm",
            _idx("right_elbow", "right_olecranon", "right_cubital_fossa"),
            ((12, 14, 16),),
        ),
        Part("left_leg", _idx("left_knee"), ((23, 25, 27),)),
        Part("right_leg", _idx("right_knee"), ((24, 26, 28),)),
        Part(
            "left_foot",
            _idx("left_ankle", "left_big_toe", "left_small_toe", "left_heel"),
            ((27, 29, 31),),
        ),
        Part(
            "right_foot",
            _idx("right_ankle", "right_big_toe", "right_small_toe", "right_heel"),
            ((28, 30, 32),),
        ),
        Part(
            "left_hand",
            hand_l,
            (tuple(range(LEFT_HAND0, LEFT_HAND0 + 21)), (15, 17, 19, 21)),
        ),
        Part(
            "right_hand",
            hand_r,
            (tuple(range(RIGHT_HAND0, RIGHT_HAND0 + 21)), (16, 18, 20, 22)),
        ),
    )
    covered = sorted(i for p in parts for i in p.members)
    if covered != list(range(len(NAMES))):
        raise AssertionError("the parts must cover each of the 308 keypoints once")
    return parts
