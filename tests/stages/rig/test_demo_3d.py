"""Real 3D offline on Pose2Sim's single-person demo (bench/demo_3d.py): the four videos'
LandmarkTracker body keypoints triangulated with the imported Qualisys calibration.

Measured on all 100 frames (docs/benchmarks.md, "demo_3d"): 99.8% of body keypoints
triangulated; median reprojection error per view 11.4 / 7.6 / 14.3 / 8.7 px over the views each
point was made from (12.2 / 10.1 / 16.3 / 9.1 px over every view that saw it); limb length CV
7-53%, mostly from cam02's left/right swaps on frames 41-81. With swap_sides
(stages/rig/sides.py) the CVs are 2.5-9.3% but for the right arm (35-42%), the errors 7.7-14.7
px; adding consistency (stages/rig/consistency.py: keypoints held to top speed and bone
length) brings every limb to 2.5-7.0%, the right arm to 5.4% / 6.7%, the errors unchanged; and
fit_bones (stages/rig/bone_fit.py: limb joints fitted to their bones' median lengths within
what the views saw) every limb to 2.2-4.3%, within the issue's 5%, the errors within 0.6 px.
The issue's 4 px per view is not met (the 2D model's scatter: 7-9 px even with a rig fitted to
these views): the strict xfail keeps that on record. Pose2Sim's own triangulation of the same
2D keypoints (its triangulation_from_best_cameras in the reference venv) agrees: the same 1897
points triangulated, 0.51 mm apart at the median (bound 10 mm; p99 1.5 mm: npucam undistorts the
points, Pose2Sim by default does not). The fast test runs the first 10 frames and holds what
does hold there: every body keypoint triangulated, every view within 20 px at the median,
Pose2Sim's 3D within 10 mm.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "demo_3d.py"
TARGET_PX = 4.0  # the issue's median reprojection error per view
TARGET_CV = 0.05  # the issue's limb-length coefficient of variation
SEEN_PX = 20.0  # measured 8-18 px on these frames: a broken calibration or pairing gives 100s
POSE2SIM_MM = 10.0  # the issue's bound between npucam's and Pose2Sim's 3D of the same 2D


def _bench():
    spec = importlib.util.spec_from_file_location("demo_3d", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_first_frames_triangulate_every_body_keypoint_within_20px():
    bench = _bench()
    result = bench.run(frames=10)
    print("\n".join(result.lines()))
    body = result.points[:, bench.BODY_IDX]
    assert body.shape == (10, 19, 3)
    assert np.isfinite(body).all()
    for cam, seen in zip(result.cameras, result.error_seen, strict=True):
        assert len(seen) >= 0.95 * body.shape[0] * body.shape[1], cam.name
        assert np.median(seen) < SEEN_PX, cam.name
    agreement = bench.pose2sim_agreement(result)
    print(agreement.line())
    assert len(agreement.mm) == body.shape[0] * body.shape[1]
    assert agreement.only_npucam == agreement.only_pose2sim == 0
    assert np.median(agreement.mm) < POSE2SIM_MM


@pytest.fixture(scope="module")
def whole_clip():
    """The bench module, the imported cameras and the whole clip's 2D keypoints (computed once)."""
    bench = _bench()
    cameras = bench.qualisys_cameras("Demo_SinglePerson", False)
    return bench, cameras, bench.landmarks()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_whole_clip_agrees_with_pose2sims_triangulation_within_10mm(whole_clip):
    bench, cameras, clip = whole_clip
    result = bench.measure(cameras, *clip)
    agreement = bench.pose2sim_agreement(result)
    print(agreement.line())
    total = np.isfinite(result.points[:, bench.BODY_IDX]).all(-1).sum()
    assert agreement.only_npucam + agreement.only_pose2sim <= 0.01 * total
    assert np.median(agreement.mm) < POSE2SIM_MM


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_swap_sides_mirrors_cam02s_swapped_frames_and_steadies_legs_and_shoulders(whole_clip):
    """Measured: cam02 mirrored on 33 frames (41-81), no other view; thighs 3.2% / 2.5%,
    shoulders 3.2% (were 8.7% / 7.1%, 46.4%)."""
    bench, cameras, clip = whole_clip
    plain = bench.measure(cameras, *clip)
    fixed = bench.measure(cameras, *clip, swap_sides=True)
    print("\n".join(fixed.lines()))
    mirrored = fixed.swapped.sum(1)
    assert mirrored[1] >= 25 and mirrored[[0, 2, 3]].sum() <= 3
    for limb in ("left_thigh", "right_thigh", "shoulders"):
        assert fixed.limb_cv[limb] <= TARGET_CV < plain.limb_cv[limb], limb


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_consistency_holds_the_right_arm_that_two_views_got_wrong(whole_clip):
    """Measured: 9 points past the top speed and 20 off their bone length triangulated again
    (29 of 1900); right upper arm 5.4%, forearm 6.7% (35.1%, 41.5% with swap_sides alone);
    every limb 2.5-7.0%; the reprojection errors within 0.1 px of before."""
    bench, cameras, clip = whole_clip
    sided = bench.measure(cameras, *clip, swap_sides=True)
    held = bench.measure(cameras, *clip, swap_sides=True, consistency=True)
    print("\n".join(held.lines()))
    assert 0 < held.chosen.moved + held.chosen.resized <= 0.05 * 1900  # a few points changed
    for limb in ("right_upper_arm", "right_forearm"):
        assert held.limb_cv[limb] < 0.25 * sided.limb_cv[limb], limb
    assert all(held.limb_cv[n] <= sided.limb_cv[n] + 0.005 for n in held.limb_cv)
    assert max(held.limb_cv.values()) < 2 * TARGET_CV
    for before, after in zip(sided.error_used, held.error_used, strict=True):
        assert abs(np.median(after) - np.median(before)) < 0.5


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fit_bones_brings_every_limb_within_the_issues_5_percent(whole_clip):
    """Measured: 1080 limb joints fitted (12 a frame after the first 10); every limb 2.2-4.3%
    (2.5-7.0% with consistency alone); the reprojection medians within 0.6 px of before."""
    bench, cameras, clip = whole_clip
    held = bench.measure(cameras, *clip, swap_sides=True, consistency=True)
    fitted = bench.measure(cameras, *clip, swap_sides=True, consistency=True, fit_bones=True)
    print("\n".join(fitted.lines()))
    assert fitted.chosen.fitted == 12 * (len(clip[0][0]) - 10)
    assert max(held.limb_cv.values()) > TARGET_CV
    assert all(cv <= TARGET_CV for cv in fitted.limb_cv.values()), fitted.limb_cv
    for before, after in zip(held.error_used, fitted.error_used, strict=True):
        assert abs(np.median(after) - np.median(before)) < 1.0


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.xfail(
    strict=True,
    reason="BlazePose 2D on these views: 7.7-14.8 px at the median with every fix on",
)
def test_whole_clip_meets_the_issues_reprojection_target(whole_clip):
    bench, cameras, clip = whole_clip
    result = bench.measure(cameras, *clip, swap_sides=True, consistency=True, fit_bones=True)
    print("\n".join(result.lines()))
    assert all(np.median(e) <= TARGET_PX for e in result.error_used)
