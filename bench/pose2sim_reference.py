"""Pose2Sim's own calibration converters and triangulation, run in the reference venv
(.venv-pose2sim). Never imported by npucam.

`python bench/pose2sim_reference.py FORMAT OUT.toml FILE [FILE ...]` calls Pose2Sim's
Pose2Sim/calibration.py calib_<format>_fun and toml_write (pose2sim 0.10.49), as its
calibrate_cams_all does, so tests/stages/rig/test_importers.py can compare npucam's import
with the file Pose2Sim writes.

`python bench/pose2sim_reference.py triangulate CALIB.toml IN.npz OUT.npz [--swap]` triangulates
IN's `keypoints` float [V, T, K, 3] (x, y, score per view) keypoint by keypoint with Pose2Sim's
Pose2Sim/triangulation.py triangulation_from_best_cameras on common.computeP's projection
matrices, as its triangulate_all does with its defaults (scores under 0.3 left out, 15 px, 2
cameras, no left/right swap, points not undistorted; with --swap, its `handle_LR_swap` on, each
keypoint's counterpart taken from IN's `mirror` [K]), and writes `points` [T, K, 3] and `error`
[T, K] (NaN where not triangulated) for bench/demo_3d.py.

`python bench/pose2sim_reference.py intrinsics CALIB_DIR OUT.toml CORNERS SQUARE_MM` runs
Pose2Sim's calibrate_intrinsics on CALIB_DIR/intrinsics/<camera>/*.jpg (its findCorners and
cv2.calibrateCamera with its flags) and writes its cameras with toml_write, for
tests/stages/rig/test_calibrate_demo.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from Pose2Sim import calibration, common, triangulation

CONVERTERS = {
    "qualisys": calibration.calib_qca_fun,
    "vicon": calibration.calib_vicon_fun,
    "easymocap": calibration.calib_easymocap_fun,
    "biocv": calibration.calib_biocv_fun,
    "opencap": calibration.calib_opencap_fun,
}


TRIANGULATION = {
    "triangulation": {
        "reproj_error_threshold_triangulation": 15,
        "min_cameras_for_triangulation": 2,
        "handle_LR_swap": False,
        "undistort_points": False,
    }
}
LIKELIHOOD_THRESHOLD = 0.3


def triangulate(calib: str, keypoints_in: str, out: str, *flags: str) -> int:
    swap = "--swap" in flags
    config = {"triangulation": {**TRIANGULATION["triangulation"], "handle_LR_swap": swap}}
    with np.load(keypoints_in) as data:
        kp = data["keypoints"].astype(np.float64)
        mirror = data["mirror"] if swap else np.arange(kp.shape[2])
    projections = common.computeP(Path(calib), undistort=False)  # rtoml reads a str as TOML
    x, y, score = kp[..., 0].copy(), kp[..., 1].copy(), kp[..., 2].copy()
    below = ~(score >= LIKELIHOOD_THRESHOLD)  # triangulate_all: NaN under the threshold
    x[below], y[below], score[below] = np.nan, np.nan, np.nan
    _, frames, count = score.shape
    points = np.full((frames, count, 3), np.nan)
    error = np.full((frames, count), np.nan)
    for t in range(frames):
        for k in range(count):
            if np.isfinite(score[:, t, k]).sum() < 2:
                continue
            coords = np.array((x[:, t, k], y[:, t, k], score[:, t, k]))
            m = mirror[k]
            swapped = np.array((x[:, t, m], y[:, t, m], score[:, t, m]))
            q, err, _, _ = triangulation.triangulation_from_best_cameras(
                config, coords, swapped, projections, None
            )
            points[t, k], error[t, k] = q, err
    np.savez(out, points=points, error=error)
    return 0


def intrinsics(calib_dir: str, out: str, corners: str, square_mm: str) -> int:
    options = {
        "show_detection_intrinsics": False,
        "intrinsics_extension": "jpg",
        "intrinsics_corners_nb": [int(n) for n in corners.split("x")],
        "intrinsics_square_size": float(square_mm),
    }
    _, names, sizes, dist, mats, rots, trans = calibration.calibrate_intrinsics(
        calib_dir, options, save_debug_images=False
    )
    calibration.toml_write(out, names, sizes, dist, mats, rots, trans)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "triangulate":
        return triangulate(*argv[1:])
    if argv[0] == "intrinsics":
        return intrinsics(*argv[1:])
    fmt, out, *files = argv
    # calib_qca_fun and calib_vicon_fun take one path; the others a list (calibrate_cams_all)
    arg = files[0] if fmt in ("qualisys", "vicon") else files
    _, names, sizes, dist, mats, rots, trans = CONVERTERS[fmt](arg, 1)
    calibration.toml_write(out, names, sizes, dist, mats, rots, trans)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
