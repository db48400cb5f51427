"""stages/landmarks/fusion.py on synthetic motion: an exact similarity motion of a part carries its
keyframe-only keypoints exactly, a shared keypoint carries the keyframe's offset halved each
half-life, and what cannot be placed is absent rather than invented."""

from __future__ import annotations

import numpy as np
import pytest

from stages.landmarks.fusion import (
    SOURCE_ABSENT,
    SOURCE_CPU,
    SOURCE_KEYFRAME,
    KeyframeFusion,
    Part,
    fit_similarity,
)

RNG = np.random.default_rng(7)
# 6 keypoints: 0-1 shared (CPU and keyframe), 2-4 keyframe-only in part "a", 5 in part "b"
PARTS = (Part("a", (0, 1, 2, 3, 4), ((0, 1, 2, 3),)), Part("b", (5,), ((4, 5),)))


def _similarity(xy: np.ndarray, angle: float, scale: float, shift: np.ndarray) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return scale * xy @ np.array([[c, s], [-s, c]]) + shift


def _setup(**kw):
    fusion = KeyframeFusion(6, PARTS, **kw)
    anchors0 = RNG.uniform(100, 300, (6, 2))
    cpu0 = np.full((6, 2), np.nan)
    cpu0[:2] = RNG.uniform(100, 300, (2, 2))
    kf = RNG.uniform(100, 300, (6, 2))
    fusion.frame(1.0, cpu0, np.ones(6), anchors0)
    fusion.keyframe(1.0, kf, np.full(6, 0.9))
    return fusion, anchors0, cpu0, kf


def test_fit_similarity_recovers_rotation_scale_and_shift_exactly():
    src = RNG.normal(size=(5, 2))
    dst = _similarity(src, 0.7, 1.3, np.array([4.0, -2.0]))
    a, b, rms = fit_similarity(src, dst)
    assert abs(a) == pytest.approx(1.3)
    assert rms < 1e-12


def test_exact_similarity_motion_carries_keyframe_only_points_exactly():
    fusion, anchors0, cpu0, kf = _setup()
    for step, (angle, scale) in enumerate([(0.1, 1.0), (0.4, 1.2), (-0.3, 0.8)], start=1):
        shift = np.array([10.0 * step, -5.0 * step])
        anchors = _similarity(anchors0, angle, scale, shift)
        cpu = cpu0.copy()
        out = fusion.frame(1.0 + step / 30, cpu, np.ones(6), anchors)
        want = _similarity(kf[2:5], angle, scale, shift)
        np.testing.assert_allclose(out.xy[2:5], want, atol=1e-9)
        assert (out.source[2:5] == SOURCE_KEYFRAME).all()
        np.testing.assert_allclose(out.age[2:5], step / 30)
        # the same motion moves part "b" (its own two anchors), also exactly
        np.testing.assert_allclose(out.xy[5], _similarity(kf[5:6], angle, scale, shift)[0])


def test_shared_points_carry_the_keyframe_offset_halved_each_half_life():
    fusion, anchors0, cpu0, kf = _setup(offset_half_life_s=0.5)
    offset = kf[:2] - cpu0[:2]
    for age, factor in [(0.25, 0.5**0.5), (0.5, 0.5), (1.0, 0.25)]:
        cpu = cpu0 + 3.0  # the CPU model moved; the correction rides on it
        out = fusion.frame(1.0 + age, cpu, np.ones(6), anchors0)
        np.testing.assert_allclose(out.xy[:2], cpu[:2] + offset * factor, rtol=1e-6)
        assert (out.source[:2] == SOURCE_CPU).all()


def test_a_part_without_two_anchors_on_both_frames_is_absent_not_invented():
    fusion, anchors0, cpu0, kf = _setup()
    anchors = anchors0.copy()
    anchors[4] = np.nan  # part "b" keeps one anchor
    out = fusion.frame(1.1, cpu0, np.ones(6), anchors)
    assert np.isnan(out.xy[5]).all()
    assert out.score[5] == 0 and out.source[5] == SOURCE_ABSENT and np.isnan(out.age[5])
    assert (out.source[2:5] == SOURCE_KEYFRAME).all()


def test_without_a_keyframe_only_cpu_points_are_published():
    fusion = KeyframeFusion(6, PARTS)
    cpu = np.full((6, 2), np.nan)
    cpu[0] = [5, 6]
    out = fusion.frame(0.5, cpu, np.full(6, 0.7), RNG.uniform(0, 9, (6, 2)))
    assert out.source.tolist() == [SOURCE_CPU] + [SOURCE_ABSENT] * 5
    assert out.score[0] == pytest.approx(0.7) and (out.score[1:] == 0).all()
    assert np.isnan(out.age).all()


def test_keyframe_score_falls_with_age_and_with_motion_a_similarity_cannot_explain():
    fusion, anchors0, cpu0, kf = _setup(score_half_life_s=1.0)
    rigid = fusion.frame(2.0, cpu0, np.ones(6), anchors0).score[2]
    assert rigid == pytest.approx(0.9 * 0.5)
    older = fusion.frame(3.0, cpu0, np.ones(6), anchors0).score[2]
    assert older == pytest.approx(0.9 * 0.25)
    bent = anchors0.copy()
    bent[0] += [30.0, 0.0]  # one anchor of part "a" moves alone: non-rigid
    assert fusion.frame(3.5, cpu0, np.ones(6), bent).score[2] < 0.9 * 0.5**2.5


def test_a_keyframe_for_a_frame_no_longer_held_is_refused():
    fusion = KeyframeFusion(6, PARTS, history_s=1.0)
    for t in (1.0, 1.5, 2.5):
        fusion.frame(t, np.zeros((6, 2)), np.ones(6), np.zeros((6, 2)))
    with pytest.raises(ValueError, match="t=1.0"):
        fusion.keyframe(1.0, np.zeros((6, 2)), np.ones(6))


def test_parts_must_not_share_a_keypoint():
    with pytest.raises(ValueError, match="already belongs"):
        KeyframeFusion(3, (Part("a", (0, 1), ((0, 1),)), Part("b", (1, 2), ((0, 1),))))
