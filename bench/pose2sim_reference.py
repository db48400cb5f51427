"""Pose2Sim's own calibration converters on a file, run in the reference venv (.venv-pose2sim).

`python bench/pose2sim_reference.py FORMAT OUT.toml FILE [FILE ...]` calls Pose2Sim's
Pose2Sim/calibration.py calib_<format>_fun and toml_write (pose2sim 0.10.49), as its
calibrate_cams_all does, so tests/stages/rig/test_importers.py can compare npucam's import
with the file Pose2Sim writes. Never imported by npucam.
"""

from __future__ import annotations

import sys

from Pose2Sim import calibration

CONVERTERS = {
    "qualisys": calibration.calib_qca_fun,
    "vicon": calibration.calib_vicon_fun,
    "easymocap": calibration.calib_easymocap_fun,
    "biocv": calibration.calib_biocv_fun,
}


def main(argv: list[str]) -> int:
    fmt, out, *files = argv
    # calib_qca_fun and calib_vicon_fun take one path; the others a list (calibrate_cams_all)
    arg = files[0] if fmt in ("qualisys", "vicon") else files
    _, names, sizes, dist, mats, rots, trans = CONVERTERS[fmt](arg, 1)
    calibration.toml_write(out, names, sizes, dist, mats, rots, trans)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
