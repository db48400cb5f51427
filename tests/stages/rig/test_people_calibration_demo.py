"""Extrinsics from people on Pose2Sim's real single-person demo (bench/people_calibration.py):
the four videos' LandmarkTracker body and hand keypoints (computed once for the module, 70-90 s
on the shared VM, hence `slow`) calibrate the rig with the Qualisys lenses, the head's points
left out; compared with the Qualisys poses after a similarity alignment (Umeyama on the camera
centres, scale free: the stated height's scale is checked separately, to 5%).

Measured on all 100 frames (docs/benchmarks.md, "people_calibration"): centres 1.47 / 1.48 /
1.64 / 1.62 cm, rotations 0.82 / 0.41 / 0.34 / 0.22 degrees (cam01..cam04), against the
issue's 3 cm and 1 degree; cam02 mirrored on 34 of its swapped frames 41-81 and on frame 10.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from stages.rig.people_calibration import calibrate_from_people
from stages.rig.rig_alignment import align_rigs

BENCH = Path(__file__).resolve().parents[3] / "bench" / "people_calibration.py"
TARGET_M = 0.03  # the bound on each camera centre
TARGET_DEG = 1.0  # and on each camera's rotation
HEIGHT_SCALE = 0.05  # a stated 1.7 m gave 0.977 of the lab's scale; Winter's proportions are
# population averages, good to a few percent
SWAPPED = range(41, 82)  # the frames where BlazePose swaps cam02's sides (docs/benchmarks.md)


def _bench():
    spec = importlib.util.spec_from_file_location("people_calibration_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo():
    """The bench module, the Qualisys cameras and the demo's 2D keypoints."""
    bench = _bench()
    reference = bench.qualisys()
    return bench, reference, bench.demo_keypoints(reference)


def _calibrated(demo, bundle_adjust: bool = True):
    bench, reference, keypoints = demo
    result = calibrate_from_people(reference, keypoints, height=1.7, bundle_adjust=bundle_adjust)
    alignment = align_rigs(list(result.calibration.cameras.values()), reference)
    print("\n".join(bench.lines(result, alignment, reference)))
    return result, alignment


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_rig_within_3cm_and_1_degree_of_qualisys(demo):
    result, alignment = _calibrated(demo)
    assert alignment.centre_error.max() < TARGET_M, alignment.centre_error
    assert alignment.rotation_error.max() < TARGET_DEG, alignment.rotation_error
    assert alignment.scale == pytest.approx(1.0, abs=HEIGHT_SCALE)
    mirrored = result.swapped.sum(1)
    assert mirrored[0] == mirrored[2] == mirrored[3] == 0
    frames = set(np.flatnonzero(result.swapped[1]).tolist())
    # measured: 34 frames of 41-81 and frame 10
    assert len(frames & set(SWAPPED)) >= 30 and len(frames - set(SWAPPED)) <= 2, frames


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_rig_misses_the_bounds_without_the_bundle_adjustment(demo):
    _, alignment = _calibrated(demo, bundle_adjust=False)
    assert alignment.centre_error.max() > TARGET_M
    assert alignment.rotation_error.max() > TARGET_DEG
