"""MediaPipe body (33) and hand (21) landmarks placed on Sapiens2's 308 keypoints
(npu/models/sapiens2/keypoints.py NAMES, docs/meta.json), only where both name the same
anatomical point; every other keypoint is absent (NaN, score 0). The table and why each row
holds is in docs/live-pose.md.
"""

from __future__ import annotations

import numpy as np

from npu.models.sapiens2.keypoints import INDEX, NAMES

NUM_KEYPOINTS = len(NAMES)

# Sapiens2 name -> BlazePose landmark index (stages/landmarks/body.py BODY_NAMES)
BODY_TO_308: dict[str, int] = {
    "nose": 0,
    "left_eye": 2,
    "right_eye": 5,
    "left_ear": 7,
    "right_ear": 8,
    "left_shoulder": 11,
    "right_shoulder": 12,
    "left_elbow": 13,
    "right_elbow": 14,
    "left_hip": 23,
    "right_hip": 24,
    "left_knee": 25,
    "right_knee": 26,
    "left_ankle": 27,
    "right_ankle": 28,
    "left_heel": 29,
    "right_heel": 30,
    "left_big_toe": 31,
    "right_big_toe": 32,
}
# used only when that hand's landmarks are missing (the hand model's wrist is preferred)
BODY_WRISTS: dict[str, int] = {"left_wrist": 15, "right_wrist": 16}

_FINGER_BASE = {"thumb": 1, "forefinger": 5, "middle_finger": 9, "ring_finger": 13}
_FINGER_BASE["pinky_finger"] = 17


def _hand_table() -> dict[str, int]:
    """Sapiens2 hand suffix -> MediaPipe hand index: {finger}4 is the tip, 3 and 2 the next
    joints towards the palm, _third_joint the base (thumb: CMC; fingers: MCP)."""
    table = {"wrist": 0}
    for finger, base in _FINGER_BASE.items():
        table[f"{finger}_third_joint"] = base
        table[f"{finger}2"] = base + 1
        table[f"{finger}3"] = base + 2
        table[f"{finger}4"] = base + 3
    return table


HAND_TO_308: dict[str, int] = _hand_table()

BODY_IDX = np.array([INDEX[n] for n in BODY_TO_308], np.int64)
BODY_SRC = np.array(list(BODY_TO_308.values()), np.int64)


def hand_indices(side: str) -> tuple[np.ndarray, np.ndarray]:
    """(308 indices, MediaPipe hand indices) of one side's 21 hand points."""
    dst = np.array([INDEX[f"{side}_{k}"] for k in HAND_TO_308], np.int64)
    src = np.array(list(HAND_TO_308.values()), np.int64)
    return dst, src


def to_308(
    body_xy: np.ndarray,
    body_score: np.ndarray,
    hands: dict[str, tuple[np.ndarray, float] | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(xy float64 [308, 2] NaN where absent, score float64 [308], 0 where absent).

    body_xy [33, 2] and body_score [33] (BlazePose visibility); hands: per side "left" /
    "right" the hand's xy [21, 2] and its hand flag (the score of all 21), or None."""
    xy = np.full((NUM_KEYPOINTS, 2), np.nan)
    score = np.zeros(NUM_KEYPOINTS)
    xy[BODY_IDX] = body_xy[BODY_SRC]
    score[BODY_IDX] = body_score[BODY_SRC]
    hands = hands or {}
    for side in ("left", "right"):
        hand = hands.get(side)
        if hand is None:
            wrist = INDEX[f"{side}_wrist"]
            src = BODY_WRISTS[f"{side}_wrist"]
            xy[wrist] = body_xy[src]
            score[wrist] = body_score[src]
            continue
        dst, src = hand_indices(side)
        xy[dst] = hand[0][src]
        score[dst] = hand[1]
    return xy, score
