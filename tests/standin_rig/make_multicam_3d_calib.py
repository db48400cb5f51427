"""Writes tests/standin_rig/multicam-3d-calib.toml, the calibration of the stand-in rig's config
(tests/standin_rig/multicam-3d.toml):
four 640x272 cameras (the sample clip's size) on a 4 m circle, 2 m up, looking at a point
1 m above the floor, world Z-up on the floor, metres. A made-up rig (the four cameras all
play the same clip), written once and committed:
    .venv/bin/python tests/standin_rig/make_multicam_3d_calib.py
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from stages.rig.calibration import Calibration, Camera, write_calibration

NAMES = ("east", "north", "west", "south")  # at azimuths 0, 90, 180, 270 degrees
SIZE = (640, 272)
FOCAL = 500.0
RADIUS_M, HEIGHT_M, TARGET = 4.0, 2.0, np.array([0.0, 0.0, 1.0])


def camera(name: str, azimuth: float) -> Camera:
    centre = np.array([RADIUS_M * np.cos(azimuth), RADIUS_M * np.sin(azimuth), HEIGHT_M])
    z = TARGET - centre
    z /= np.linalg.norm(z)
    x = np.cross(z, [0.0, 0.0, 1.0])
    x /= np.linalg.norm(x)
    rot = np.stack([x, np.cross(z, x), z])  # image x right, y down, z forward
    matrix = [[FOCAL, 0.0, SIZE[0] / 2], [0.0, FOCAL, SIZE[1] / 2], [0.0, 0.0, 1.0]]
    rvec = cv2.Rodrigues(rot)[0].ravel()
    return Camera(name, SIZE, matrix, np.zeros(4), rvec, -rot @ centre)


def main() -> None:
    cams = {f"cam_{i + 1:02d}": camera(n, np.pi / 2 * i) for i, n in enumerate(NAMES)}
    out = Path(__file__).with_name("multicam-3d-calib.toml")
    write_calibration(out, Calibration(cams, {"adjusted": False, "error": 0.0}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
