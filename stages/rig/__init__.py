"""A rig: a set of calibrated cameras viewing one space, and the host-side 3D work on it.

Calibration file and camera model, other tools' calibrations imported, board detection and
calibration (and the board views of `npucam calibrate`), frame grouping by capture time,
cross-view person association, left/right swaps undone, triangulation, quality measures,
temporal filtering and .trc export, and the live `rig3d` stage that runs them on a pipeline's
2D poses and publishes `pose3d/<rig>` (docs/rig.md).
"""
