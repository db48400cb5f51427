"""Extrinsics from people on Pose2Sim's real single-person demo (bench/people_calibration.py):
the four videos' LandmarkTracker body keypoints (computed once for the module, ~40 s) calibrate
the rig with the Qualisys lenses; compared with the Qualisys poses after a similarity alignment
(Umeyama on the camera centres, scale free).

Measured on all 100 frames (docs/benchmarks.md, "people_calibration"): centres 1.52 / 0.74 /
3.12 / 3.45 cm, rotations 1.72 / 0.89 / 1.24 / 0.73 degrees (cam01..cam04); without the bundle
adjustment (the spanning tree of essential matrices alone) 29.6 / 27.6 / 14.7 / 11.0 cm and
4.1 / 5.1 / 3.7 / 2.5 degrees. The issue's bounds (3 cm, 1 degree) are not met: the strict
xfail keeps that on record. What holds is asserted beside it.
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
HOLDS_M = 0.05  # measured 0.7-3.5 cm; the initial rig alone is 11-30 cm off
HOLDS_DEG = 2.5  # measured 0.7-1.7 degrees; the initial rig alone 2.5-5.1
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
    """The Qualisys cameras, the demo rig calibrated from its person, its alignment."""
    bench = _bench()
    reference = bench.qualisys()
    keypoints = bench.demo_keypoints(reference)
    result = calibrate_from_people(reference, keypoints, height=1.7)
    alignment = align_rigs(list(result.calibration.cameras.values()), reference)
    print("\n".join(bench.lines(result, alignment, reference)))
    return reference, result, alignment


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.xfail(
    strict=True,
    reason="measured: centres 1.52 / 0.74 / 3.12 / 3.45 cm, rotations 1.72 / 0.89 / 1.24 / "
    "0.73 deg (cam01..cam04) against 3 cm and 1 deg",
)
def test_demo_rig_within_3cm_and_1_degree_of_qualisys(demo):
    _, _, alignment = demo
    assert alignment.centre_error.max() < TARGET_M
    assert alignment.rotation_error.max() < TARGET_DEG


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_rig_within_5cm_and_25_degrees_and_cam02s_swaps_found(demo):
    _, result, alignment = demo
    assert alignment.centre_error.max() < HOLDS_M, alignment.centre_error
    assert alignment.rotation_error.max() < HOLDS_DEG, alignment.rotation_error
    mirrored = result.swapped.sum(1)
    assert mirrored[0] == mirrored[2] == mirrored[3] == 0
    frames = np.flatnonzero(result.swapped[1])
    assert len(frames) >= 25 and set(frames) <= set(SWAPPED), frames
