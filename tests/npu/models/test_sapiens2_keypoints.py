"""The 308-keypoint metadata: names, groups, skeleton, flip pairs, face-alignment points.

Spot values are KP308's (sapiens keypoints308.py, teeth removed) and docs/pose.md.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from npu.models.sapiens2 import keypoints as kp


def test_308_unique_names_in_spec_layout():
    assert len(kp.NAMES) == 308 and len(set(kp.NAMES)) == 308
    spots = {
        0: "nose", 5: "left_shoulder", 9: "left_hip", 14: "right_ankle", 15: "left_big_toe",
        20: "right_heel", 21: "right_thumb4", 24: "right_thumb_third_joint", 41: "right_wrist",
        42: "left_thumb4", 62: "left_wrist", 63: "left_olecranon", 69: "neck",
        70: "center_of_glabella", 77: "tip_of_chin", 78: "upper_startpoint_of_r_eyebrow",
        87: "upper_startpoint_of_l_eyebrow", 96: "l_inner_end_of_upper_lash_line",
        97: "l_outer_end_of_upper_lash_line", 106: "l_midpoint_6_of_upper_eyelid_line",
        120: "r_inner_end_of_upper_lash_line", 121: "r_outer_end_of_upper_lash_line",
        130: "r_midpoint_3_of_upper_eyelid_line", 144: "l_inner_end_of_lower_lash_line",
        155: "l_midpoint_2_of_lower_eyelid_line", 161: "r_inner_end_of_lower_lash_line",
        171: "r_midpoint_3_of_lower_eyelid_line", 178: "tip_of_nose",
        183: "outer_corner_of_r_nostril", 188: "r_outer_corner_of_mouth",
        189: "l_outer_corner_of_mouth", 190: "center_of_cupid_bow",
        204: "r_inner_corner_of_mouth", 208: "midpoint_1_of_upper_inner_lip",
        219: "midpoint_6_of_lower_inner_lip", 220: "l_top_end_of_inferior_crus",
        245: "l_point_8_of_inner_helix", 246: "r_top_end_of_inferior_crus",
        255: "r_point_8_of_inner_helix", 271: "r_point_2_of_inner_helix",
        272: "l_center_of_iris", 281: "r_center_of_iris", 290: "l_center_of_pupil",
        299: "r_center_of_pupil", 307: "r_border_of_pupil_midpoint_2",
    }  # fmt: skip
    for i, name in spots.items():
        assert kp.NAMES[i] == name, i
    assert not any("teeth" in n for n in kp.NAMES)


def test_groups_partition_the_keypoints():
    members = sorted(i for g in kp.GROUPS.values() for i in g)
    assert members == list(range(308))
    assert set(kp.GROUPS) == {"body", "feet", "hands", "face"}
    assert all(kp.NAMES[i].startswith(("left_", "right_")) for i in kp.GROUPS["hands"])
    assert "neck" in [kp.NAMES[i] for i in kp.GROUPS["body"]]


def test_skeleton_has_the_65_kp308_links():
    assert len(kp.SKELETON) == 65 and len(set(kp.SKELETON)) == 65
    assert kp.SKELETON[:4] == ((13, 11), (11, 9), (14, 12), (12, 10))
    assert (7, 62) in kp.SKELETON and (8, 41) in kp.SKELETON  # elbows to wrists
    for a, b in kp.SKELETON:  # no face links
        assert a < 70 and b < 70
    left_hand = [(a, b) for a, b in kp.SKELETON if 42 <= max(a, b) <= 62 and min(a, b) >= 42]
    assert left_hand[:4] == [(62, 45), (45, 44), (44, 43), (43, 42)]


def _side_tokens(name: str) -> list[str]:
    return re.findall(r"(?<![a-z])(left|right|l|r)(?=_)", name)


def test_flip_pairs_are_symmetric_and_swap_sides():
    partner = {}
    for a, b in kp.FLIP_PAIRS:
        assert a != b and a not in partner and b not in partner
        partner[a], partner[b] = b, a
    assert len(kp.FLIP_PAIRS) == 146  # 308 - 16 self-symmetric midline points
    for i, name in enumerate(kp.NAMES):
        if i not in partner:
            assert _side_tokens(name) == [], name
            continue
        other = kp.NAMES[partner[i]]
        assert kp.SWAP[partner[i]] == name  # swap of the swap is the name itself
        mirrored = {"left": "right", "right": "left", "l": "r", "r": "l"}
        assert _side_tokens(other) == [mirrored[t] for t in _side_tokens(name)]
        if not _side_tokens(name):  # lip contours: numbered around the mouth, no side word
            assert name.endswith("_lip") and name != other, name
        # besides the side, only contour numbers may differ
        strip = lambda n: re.sub(r"\d+", "#", re.sub(r"(?<![a-z])(left|right|l|r)_", "", n))  # noqa: E731
        assert strip(name) == strip(other), (name, other)
    assert (kp.INDEX["l_point_2_of_inner_helix"], kp.INDEX["r_point_8_of_inner_helix"]) in set(
        kp.FLIP_PAIRS
    )


def test_face_alignment_points_and_fallbacks():
    assert [c[0] for c in kp.FACE5] == [299, 290, 178, 188, 189]
    rng = np.random.default_rng(0)
    k = np.concatenate([rng.uniform(0, 100, (308, 2)), np.full((308, 1), 0.9)], axis=1)
    np.testing.assert_allclose(kp.face_points(k), k[[299, 290, 178, 188, 189], :2], rtol=1e-6)
    k[299, 2] = k[281, 2] = 0.1  # right pupil and iris unsure: fall back to the body eye
    assert np.allclose(kp.face_points(k)[0], k[2, :2])
    k[2, 2] = 0.0  # ... then to the mean of the right eye's canthi
    assert np.allclose(kp.face_points(k)[0], k[[120, 121], :2].mean(axis=0))
    k[120, 2] = 0.0
    assert kp.face_points(k) is None
    with pytest.raises(ValueError, match="308, 3"):
        kp.face_points(np.zeros((17, 3)))
