"""A rig: a set of calibrated cameras viewing one space, and the host-side 3D work on it.

Calibration file and camera model, board detection and calibration, frame grouping by capture
time, cross-view person association, triangulation, temporal filtering and .trc export
(docs/rig.md).
"""
