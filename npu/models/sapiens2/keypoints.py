"""The 308 Sapiens2-Pose keypoints as data: names, groups, skeleton, flip pairs, face points.

The list is Goliath's 344 points with the 36 teeth (344-ids 220-255) removed, so a 308-index
equals the 344-id below 220 and the 344-id - 36 above 255. "left"/"l_" is the subject's
left. Reference: sapiens keypoints308.py (KP308 in docs/pose.md; the same data as
facebookresearch/sapiens goliath.py): keypoint names, `swap` names and `skeleton_info`.
"""

from __future__ import annotations

import re

import numpy as np

_BODY = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear",
    "left_shoulder", "right_shoulder", "left_elbow", "right_elbow",
    "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle",
    "left_big_toe", "left_small_toe", "left_heel",
    "right_big_toe", "right_small_toe", "right_heel",
)  # fmt: skip
_FINGERS = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")


def _hand(side: str) -> tuple[str, ...]:
    """Each finger tip -> base: {side}_{finger}4, 3, 2, third_joint."""
    return tuple(f"{side}_{f}{j}" for f in _FINGERS for j in ("4", "3", "2", "_third_joint")) + (
        f"{side}_wrist",
    )


_ARMS_NECK = (
    "left_olecranon", "right_olecranon", "left_cubital_fossa", "right_cubital_fossa",
    "left_acromion", "right_acromion", "neck",
)  # fmt: skip


def _eye_line(side: str, line: str, order: str) -> tuple[str, ...]:
    names = {"c": f"{side}_centerpoint_of_{line}"}
    names.update({d: f"{side}_midpoint_{d}_of_{line}" for d in "123456"})
    return tuple(names[c] for c in order)


def _eye(side: str, upper: bool) -> tuple[str, ...]:
    """One eye's upper (lash, eyelid, crease: 24 points) or lower (lash, eyelid: 17) lines."""
    v = "upper" if upper else "lower"
    lash_order, lid_order = ("216543", "625c413") if side == "l" else ("123456", "314c526")
    lash = (
        f"{side}_inner_end_of_{v}_lash_line",
        f"{side}_outer_end_of_{v}_lash_line",
    ) + _eye_line(side, f"{v}_lash_line", "c" + lash_order)
    eyelid = (f"{side}_outer_end_of_{v}_eyelid_line",) + _eye_line(
        side, f"{v}_eyelid_line", lid_order
    )
    crease = _eye_line(side, f"{v}_crease_line", lid_order) if upper else ()
    return lash + eyelid + crease


_FACE_CENTRE = (
    "center_of_glabella", "center_of_nose_root", "tip_of_nose_bridge",
    "midpoint_1_of_nose_bridge", "midpoint_2_of_nose_bridge", "midpoint_3_of_nose_bridge",
    "center_of_labiomental_groove", "tip_of_chin",
)  # fmt: skip


def _eyebrow(side: str) -> tuple[str, ...]:
    return (
        f"upper_startpoint_of_{side}_eyebrow", f"lower_startpoint_of_{side}_eyebrow",
        f"end_of_{side}_eyebrow",
        f"upper_midpoint_1_of_{side}_eyebrow", f"lower_midpoint_1_of_{side}_eyebrow",
        f"upper_midpoint_2_of_{side}_eyebrow", f"upper_midpoint_3_of_{side}_eyebrow",
        f"lower_midpoint_2_of_{side}_eyebrow", f"lower_midpoint_3_of_{side}_eyebrow",
    )  # fmt: skip


_NOSE = (
    "tip_of_nose", "bottom_center_of_nose", "r_outer_corner_of_nose", "l_outer_corner_of_nose",
    "inner_corner_of_r_nostril", "outer_corner_of_r_nostril", "upper_corner_of_r_nostril",
    "inner_corner_of_l_nostril", "outer_corner_of_l_nostril", "upper_corner_of_l_nostril",
)  # fmt: skip


def _lips(kind: str) -> tuple[str, ...]:
    """One lip contour ("outer" or "inner"): centres, then midpoints 1/2 and 3..6."""
    return (
        f"midpoint_1_of_upper_{kind}_lip", f"midpoint_2_of_upper_{kind}_lip",
        f"midpoint_1_of_lower_{kind}_lip", f"midpoint_2_of_lower_{kind}_lip",
    ) + tuple(
        f"midpoint_{d}_of_{v}_{kind}_lip" for v in ("upper", "lower") for d in "3456"
    )  # fmt: skip


_MOUTH = (
    ("r_outer_corner_of_mouth", "l_outer_corner_of_mouth",
     "center_of_cupid_bow", "center_of_lower_outer_lip")
    + _lips("outer")
    + ("r_inner_corner_of_mouth", "l_inner_corner_of_mouth",
       "center_of_upper_inner_lip", "center_of_lower_inner_lip")
    + _lips("inner")
)  # fmt: skip


def _ear(side: str) -> tuple[str, ...]:
    # the right ear lists inner-helix points 8 and 2 where the left lists 2 and 8
    p2, p8 = ("2", "8") if side == "l" else ("8", "2")
    return (
        f"{side}_top_end_of_inferior_crus", f"{side}_top_end_of_superior_crus",
        f"{side}_start_of_antihelix", f"{side}_end_of_antihelix",
        f"{side}_midpoint_1_of_antihelix", f"{side}_midpoint_1_of_inferior_crus",
        f"{side}_midpoint_2_of_antihelix", f"{side}_midpoint_3_of_antihelix",
        f"{side}_point_1_of_inner_helix", f"{side}_point_{p2}_of_inner_helix",
    ) + tuple(f"{side}_point_{d}_of_inner_helix" for d in "34567") + (
        f"{side}_highest_point_of_antitragus", f"{side}_bottom_point_of_tragus",
        f"{side}_protruding_point_of_tragus", f"{side}_top_point_of_tragus",
        f"{side}_start_point_of_crus_of_helix", f"{side}_deepest_point_of_concha",
        f"{side}_tip_of_ear_lobe", f"{side}_midpoint_between_22_15",
        f"{side}_bottom_connecting_point_of_ear_lobe", f"{side}_top_connecting_point_of_helix",
        f"{side}_point_{p8}_of_inner_helix",
    )  # fmt: skip


def _ring(side: str, part: str) -> tuple[str, ...]:
    """Iris or pupil: centre, then the border clockwise from 3 o'clock."""
    b = f"{side}_border_of_{part}"
    clock = ("3", "midpoint_1", "12", "midpoint_4", "9", "midpoint_3", "6", "midpoint_2")
    return (f"{side}_center_of_{part}",) + tuple(f"{b}_{s}" for s in clock)


NAMES: tuple[str, ...] = (
    _BODY
    + _hand("right")
    + _hand("left")
    + _ARMS_NECK
    + _FACE_CENTRE
    + _eyebrow("r")
    + _eyebrow("l")
    + _eye("l", True)
    + _eye("r", True)
    + _eye("l", False)
    + _eye("r", False)
    + _NOSE
    + _MOUTH
    + _ear("l")
    + _ear("r")
    + _ring("l", "iris")
    + _ring("r", "iris")
    + _ring("l", "pupil")
    + _ring("r", "pupil")
)
INDEX: dict[str, int] = {name: i for i, name in enumerate(NAMES)}

# Index ranges (docs/pose.md). 63-69 (olecranon, cubital fossa, acromion, neck) are arm and neck
# points, so they are body here although taconite colours [63, 308) as face.
GROUPS: dict[str, tuple[int, ...]] = {
    "body": tuple(range(0, 15)) + tuple(range(63, 70)),
    "feet": tuple(range(15, 21)),
    "hands": tuple(range(21, 63)),
    "face": tuple(range(70, 308)),
}

# KP308 `swap` names that are not the plain left/right mirror of the name: numbered contour
# points are numbered in one direction around both sides, so their numbers change too.
_EYE_LINE_SWAP = {"1": "2", "2": "1", "3": "6", "4": "5", "5": "4", "6": "3"}  # l -> r
_RING_SWAP = {"3": "9", "9": "3", "midpoint_1": "midpoint_4", "midpoint_4": "midpoint_1",
              "midpoint_2": "midpoint_3", "midpoint_3": "midpoint_2"}  # fmt: skip


def _mirror_side(name: str) -> str:
    """Swap every left/right marker: left_ <-> right_, l_ <-> r_ (prefix or infix)."""
    table = {"left": "right", "right": "left", "l": "r", "r": "l"}
    return re.sub(r"(?<![a-z])(left|right|l|r)(?=_)", lambda m: table[m[1]], name)


def _swap_name(name: str) -> str:
    """The KP308 `swap` of a keypoint name ("" when it has no mirror partner)."""
    m = re.fullmatch(r"([lr])_midpoint_(\d)_of_((?:upper|lower)_(?:lash|eyelid|crease)_line)", name)
    if m:
        side, d, line = m.groups()
        inv = {v: k for k, v in _EYE_LINE_SWAP.items()}
        d2 = _EYE_LINE_SWAP[d] if side == "l" else inv[d]
        return f"{'r' if side == 'l' else 'l'}_midpoint_{d2}_of_{line}"
    m = re.fullmatch(r"midpoint_(\d)_of_((?:upper|lower)_(?:outer|inner)_lip)", name)
    if m:
        return f"midpoint_{_EYE_LINE_SWAP[m[1]]}_of_{m[2]}"
    m = re.fullmatch(r"(upper|lower)_midpoint_([23])_of_([lr])_eyebrow", name)
    if m:
        return f"{m[1]}_midpoint_{5 - int(m[2])}_of_{'r' if m[3] == 'l' else 'l'}_eyebrow"
    m = re.fullmatch(r"([lr])_point_([28])_of_inner_helix", name)
    if m:
        return f"{'r' if m[1] == 'l' else 'l'}_point_{10 - int(m[2])}_of_inner_helix"
    m = re.fullmatch(r"([lr])_border_of_(iris|pupil)_(\w+)", name)
    if m:
        pos = _RING_SWAP.get(m[3], m[3])
        return f"{'r' if m[1] == 'l' else 'l'}_border_of_{m[2]}_{pos}"
    mirrored = _mirror_side(name)
    return "" if mirrored == name else mirrored


SWAP: tuple[str, ...] = tuple(_swap_name(n) for n in NAMES)
FLIP_PAIRS: tuple[tuple[int, int], ...] = tuple(
    (i, INDEX[s]) for i, s in enumerate(SWAP) if s and i < INDEX[s]
)

_SKELETON_NAMES = (
    ("left_ankle", "left_knee"), ("left_knee", "left_hip"), ("right_ankle", "right_knee"),
    ("right_knee", "right_hip"), ("left_hip", "right_hip"), ("left_shoulder", "left_hip"),
    ("right_shoulder", "right_hip"), ("left_shoulder", "right_shoulder"),
    ("left_shoulder", "left_elbow"), ("right_shoulder", "right_elbow"),
    ("left_elbow", "left_wrist"), ("right_elbow", "right_wrist"), ("left_eye", "right_eye"),
    ("nose", "left_eye"), ("nose", "right_eye"), ("left_eye", "left_ear"),
    ("right_eye", "right_ear"), ("left_ear", "left_shoulder"), ("right_ear", "right_shoulder"),
    ("left_ankle", "left_big_toe"), ("left_ankle", "left_small_toe"), ("left_ankle", "left_heel"),
    ("right_ankle", "right_big_toe"), ("right_ankle", "right_small_toe"),
    ("right_ankle", "right_heel"),
) + tuple(
    link
    for side in ("left", "right")
    for f in _FINGERS
    for link in (
        (f"{side}_wrist", f"{side}_{f}_third_joint"), (f"{side}_{f}_third_joint", f"{side}_{f}2"),
        (f"{side}_{f}2", f"{side}_{f}3"), (f"{side}_{f}3", f"{side}_{f}4"),
    )
)  # fmt: skip
SKELETON: tuple[tuple[int, int], ...] = tuple((INDEX[a], INDEX[b]) for a, b in _SKELETON_NAMES)

# 5-point face alignment in ArcFace order (image-left eye, image-right eye, nose, image-left
# mouth corner, image-right mouth corner; a frontal face shows the subject's right on the
# image left). Each point lists its candidates best first; an eye given as a pair is the mean
# of the two canthi (inner and outer ends of the upper lash line).
FACE5: tuple[tuple[int | tuple[int, int], ...], ...] = (
    (INDEX["r_center_of_pupil"], INDEX["r_center_of_iris"], INDEX["right_eye"],
     (INDEX["r_inner_end_of_upper_lash_line"], INDEX["r_outer_end_of_upper_lash_line"])),
    (INDEX["l_center_of_pupil"], INDEX["l_center_of_iris"], INDEX["left_eye"],
     (INDEX["l_inner_end_of_upper_lash_line"], INDEX["l_outer_end_of_upper_lash_line"])),
    (INDEX["tip_of_nose"], INDEX["nose"]),
    (INDEX["r_outer_corner_of_mouth"], INDEX["r_inner_corner_of_mouth"]),
    (INDEX["l_outer_corner_of_mouth"], INDEX["l_inner_corner_of_mouth"]),
)  # fmt: skip


def face_points(keypoints: np.ndarray, min_score: float = 0.3) -> np.ndarray | None:
    """The 5 face-alignment points of one person, or None if any has no confident candidate.

    keypoints: float [308, 3] (x, y, score) -> float32 [5, 2] in the FACE5 order. A candidate
    counts when its score (every canthus score, for a pair) exceeds min_score.
    """
    kp = np.asarray(keypoints, dtype=np.float64)
    if kp.shape != (len(NAMES), 3):
        raise ValueError(f"keypoints must be [{len(NAMES)}, 3], got {kp.shape}")
    out = np.empty((5, 2), np.float32)
    for i, candidates in enumerate(FACE5):
        for c in candidates:
            idx = list(c) if isinstance(c, tuple) else [c]
            if np.all(kp[idx, 2] > min_score):
                out[i] = kp[idx, :2].mean(axis=0)
                break
        else:
            return None
    return out


# One colour per keypoint group (#rrggbb) for drawing: points take their group's colour, and an
# edge the group it lies in (an edge between body and hands or feet is drawn in the limb's).
GROUP_COLOURS: dict[str, str] = {
    "body": "#00e676",
    "feet": "#ff9100",
    "hands": "#2979ff",
    "face": "#ff4081",
}


def _edge_group(group_of: list[str], a: int, b: int) -> str:
    """The group an edge is drawn in: its points' own, or the limb's when one is body."""
    ga, gb = group_of[a], group_of[b]
    if ga == gb:
        return ga
    return gb if ga == "body" else ga


def wire_meta() -> dict:
    """The pose section of the `meta` message (docs/protocol.md, docs/meta.json): keypoint
    names, groups with colours, and skeleton edges with the group each is drawn in."""
    group_of = [""] * len(NAMES)
    for group, indices in GROUPS.items():
        for i in indices:
            group_of[i] = group
    return {
        "model": "sapiens2",
        "keypoint_set": "sapiens2-308",
        "count": len(NAMES),
        "columns": ["x", "y", "score"],
        "names": list(NAMES),
        "group_of": group_of,
        "groups": [{"name": g, "color": GROUP_COLOURS[g], "count": len(GROUPS[g])} for g in GROUPS],
        "skeleton": [[a, b, _edge_group(group_of, a, b)] for a, b in SKELETON],
    }
