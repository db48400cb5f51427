"""Extrinsics from people on Pose2Sim's single-person demo: the four videos' LandmarkTracker
body and hand keypoints -> stages/rig/people_calibration.py with the Qualisys lenses -> per
camera, how far the rig is from the lab's Qualisys calibration after a similarity alignment
(stages/rig/rig_alignment.py).

Usage: python bench/people_calibration.py [--frames N] [--height M] [--no-bundle-adjustment]
                                          [--body-only] [--with-head]
The 2D is the body and both hands (LandmarkTracker's hand models); the head's points are left
out (people_calibration.HEAD) unless --with-head. The lenses (matrix, distortions) are the
demo's Calib.qca.txt imported as Pose2Sim converts it
(stages/rig/importers.py); only the poses are estimated. cam01 and cam02 decode 1080 px wide
against the calibration's 1088: their keypoints are rescaled to 1088, as `npucam calibrate
people` does. The alignment's scale is free (Umeyama with scale); the scale the stated body
height gave is printed beside it. tests/stages/rig/test_people_calibration_demo.py asserts the
issue's bounds (3 cm, 1 degree).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the npucam command sets it

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.assets import POSE2SIM_CAMERAS, pose2sim_demo  # noqa: E402
from stages.landmarks.video import video_people  # noqa: E402
from stages.rig.calibration import Camera  # noqa: E402
from stages.rig.importers import import_calibration  # noqa: E402
from stages.rig.people_calibration import (  # noqa: E402
    HEAD,
    PeopleCalibration,
    calibrate_from_people,
)
from stages.rig.rig_alignment import RigAlignment, align_rigs  # noqa: E402

DEMO = "Demo_SinglePerson"


def qualisys(demo: str = DEMO) -> list[Camera]:
    path = pose2sim_demo(demo) / "calibration" / "Calib.qca.txt"
    return list(import_calibration("qualisys", [path]).cameras.values())


def demo_keypoints(
    lenses: list[Camera], demo: str = DEMO, frames: int = 0, hands: bool = True
) -> np.ndarray:
    """float64 [V, T, 308, 3]: one person per view, pixels rescaled to the lens's size."""
    views = []
    for cam, lens in zip(POSE2SIM_CAMERAS, lenses, strict=True):
        video = pose2sim_demo(demo) / "videos" / f"{cam}.mp4"
        found = video_people(video, 1, frames, hands=hands)
        kp = found.keypoints[:, 0].copy()
        kp[..., :2] *= np.divide(lens.size, found.size)
        views.append(kp)
    n = min(len(v) for v in views)
    return np.stack([v[:n] for v in views])


def lines(result: PeopleCalibration, alignment: RigAlignment, reference: list[Camera]) -> list[str]:
    out = [
        f"pair {p.a + 1}-{p.b + 1}: {p.inliers} of {p.matched} keypoints fit its essential matrix"
        for p in result.pairs
    ]
    stage = "bundle adjustment" if result.calibration.metadata["adjusted"] else "initial rig"
    out.append(
        f"{stage}: RMS {result.rms:.2f} px over {result.observations} observations "
        f"({result.outliers} past 3x the loss scale); mirrored frames per view "
        f"{result.swapped.sum(1).tolist()}"
    )
    for cam, err, deg, rms in zip(
        reference, alignment.centre_error, alignment.rotation_error, result.camera_rms, strict=True
    ):
        out.append(
            f"{cam.name}: centre {err * 100:.2f} cm, rotation {deg:.3f} deg, RMS {rms:.2f} px"
        )
    out.append(
        f"similarity scale {alignment.scale:.4f} (1 = the {result.scale_from} gave the lab's "
        f"scale); worst centre {alignment.centre_error.max() * 100:.2f} cm, worst rotation "
        f"{alignment.rotation_error.max():.3f} deg"
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=0, help="first N frames (default: all)")
    ap.add_argument("--height", type=float, default=1.7, help="the stated body height, m")
    ap.add_argument("--no-bundle-adjustment", action="store_true")
    ap.add_argument("--body-only", action="store_true", help="without the hands' keypoints")
    ap.add_argument(
        "--with-head", action="store_true", help="use the head's points too (nose, eyes, ears)"
    )
    args = ap.parse_args()
    reference = qualisys()
    t0 = time.perf_counter()
    keypoints = demo_keypoints(reference, frames=args.frames, hands=not args.body_only)
    t1 = time.perf_counter()
    result = calibrate_from_people(
        reference,
        keypoints,
        height=args.height,
        ignore=() if args.with_head else HEAD,
        bundle_adjust=not args.no_bundle_adjustment,
    )
    t2 = time.perf_counter()
    estimate = list(result.calibration.cameras.values())
    for line in lines(result, align_rigs(estimate, reference), reference):
        print(line)
    print(f"{t1 - t0:.0f} s of 2D keypoints, {t2 - t1:.0f} s of calibration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
