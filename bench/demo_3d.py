"""Real 3D offline on Pose2Sim's single-person demo: 2D body landmarks per view, triangulated
with the lab's Qualisys calibration, and how well the views agree.

Usage: python bench/demo_3d.py [--demo Demo_SinglePerson] [--frames N] [--raw-distortion]
                              [--swap-sides] [--consistency] [--pose2sim]
                              [--fit-bones] [--calibration FILE] [--rescale]
Each of the four 60 fps videos goes through its own LandmarkTracker (stages/landmarks/video.py:
body, one person; timestamps i / 60 s), placed on the 308 keypoints by to_308; the f-th frames are
one instant (the demo's videos are synchronised). The calibration is the demo's Calib.qca.txt
imported as Pose2Sim converts it (stages/rig/importers.py); --raw-distortion keeps Qualisys'
radial and tangential coefficients as written instead of Pose2Sim's division by 64 (docs/rig.md,
"Importing a calibration"); --calibration takes the cameras of the same names from another
file instead (e.g. one `npucam calibrate people` wrote from these videos), and --rescale scales
each view's keypoints to the size its camera is calibrated at, as that command does (cam01 and
cam02 decode 1080 px wide against 1088). Triangulation is stages/rig/triangulate.py with
Pose2Sim's defaults; --swap-sides first undoes a view's left/right swaps (stages/rig/sides.py,
the rig3d stage's `swap_sides`); --consistency then takes the frames in order and triangulates
again, from another view subset, the keypoints that break the person's top speed or bone
lengths (stages/rig/consistency.py, the rig3d stage's `consistency`), and with --fit-bones moves
the limb joints toward the bone lengths kept so far (stages/rig/bone_fit.py, `fit_bones`).
Prints per view the median reprojection error of the triangulated body keypoints (over the views
each was triangulated from, and over every view that saw it) and its median direction
(reprojection_offsets: a view whose calibration does not fit the others' is off one way), and
each limb's coefficient of variation of length over the clip (stages/rig/quality.py); with
--pose2sim, how far npucam's 3D points are from Pose2Sim's own triangulation of the same 2D
keypoints (run in the reference venv by bench/pose2sim_reference.py).
tests/stages/rig/test_demo_3d.py asserts them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.assets import POSE2SIM_CAMERAS, pose2sim_demo  # noqa: E402
from stages.landmarks.schema import BODY_IDX  # noqa: E402
from stages.landmarks.video import video_people  # noqa: E402
from stages.rig.bone_fit import BoneFitParams  # noqa: E402
from stages.rig.calibration import Calibration, Camera, read_calibration, write_calibration  # noqa: E402
from stages.rig.consistency import Choice, ConsistencyParams, hold_clip  # noqa: E402
from stages.rig.importers import QUALISYS_SUBPIXELS, import_calibration  # noqa: E402
from stages.rig.quality import (  # noqa: E402
    LIMBS,
    coefficient_of_variation,
    limb_lengths,
    reprojection_errors,
    reprojection_offsets,
)
from stages.rig.sides import unswap_views  # noqa: E402
from stages.rig.triangulate import (  # noqa: E402
    MAX_ERROR_PX,
    MIN_CONFIDENCE,
    MIN_VIEWS,
    triangulate,
)

FPS = 60.0
REFERENCE_PYTHON = ROOT / ".venv-pose2sim" / "bin" / "python"
REFERENCE_SCRIPT = ROOT / "bench" / "pose2sim_reference.py"


@dataclass
class Demo3D:
    cameras: list[Camera]
    sizes: list[tuple[int, int]]  # each video's decoded (width, height)
    keypoints: np.ndarray  # float64 [V, T, 308, 3]: x, y, score; NaN where no person
    points: np.ndarray  # float64 [T, 308, 3] m
    used: np.ndarray  # bool [V, T, 308]
    error_used: list[np.ndarray]  # per view: px, over the views each point was made from
    error_seen: list[np.ndarray]  # per view: px, over every view that saw it (score >= 0.3)
    offsets: np.ndarray  # float [V, 2]: per view the median (projected - seen) of error_used's
    limb_cv: dict[str, float]
    seconds_2d: float
    swapped: np.ndarray  # bool [V, T]: the views --swap-sides mirrored
    chosen: Choice | None = None  # keypoints --consistency triangulated again

    def lines(self) -> list[str]:
        body = self.points[:, BODY_IDX]
        made = np.isfinite(body).all(-1).mean()
        out = [
            f"views mirrored by swap_sides: {self.swapped.sum(1).tolist()} frames per view",
            f"body keypoints triangulated: {made:.1%} of {body.shape[0]} frames x "
            f"{body.shape[1]} ({self.seconds_2d:.0f} s of 2D landmarks)",
        ]
        if self.chosen is not None:
            out.append(
                f"consistency: {self.chosen.moved} keypoints past the top speed and "
                f"{self.chosen.resized} off their bone length triangulated again; "
                f"{self.chosen.fitted} limb joints fitted to their bone lengths"
            )
        for cam, size, used, seen, off in zip(
            self.cameras, self.sizes, self.error_used, self.error_seen, self.offsets, strict=True
        ):
            out.append(
                f"{cam.name} ({size[0]}x{size[1]} decoded, calibrated {cam.size[0]}x"
                f"{cam.size[1]}): median reprojection {np.median(used):.2f} px over {len(used)} "
                f"points it made, {np.median(seen):.2f} px over {len(seen)} it saw; median "
                f"offset {off[0]:+.1f}, {off[1]:+.1f} px"
            )
        for name, cv in self.limb_cv.items():
            out.append(f"{name}: length CV {cv:.1%}")
        return out


def qualisys_cameras(demo: str, raw_distortion: bool) -> list[Camera]:
    calibration: Calibration = import_calibration(
        "qualisys", [pose2sim_demo(demo) / "calibration" / "Calib.qca.txt"]
    )
    cameras = list(calibration.cameras.values())
    if raw_distortion:
        cameras = [replace(c, distortions=c.distortions * QUALISYS_SUBPIXELS) for c in cameras]
    return cameras


def file_cameras(path: Path) -> list[Camera]:
    """The demo's cameras (cam01..cam04) from a calibration file."""
    calibration = read_calibration(path)
    return [calibration.camera(name) for name in POSE2SIM_CAMERAS]


def rescaled(keypoints: np.ndarray, cameras: list[Camera], sizes) -> np.ndarray:
    """keypoints [V, T, 308, 3] with each view's x, y scaled from its decoded size to its
    camera's calibrated one (stages/commands/calibrate.py does the same)."""
    out = keypoints.copy()
    for v, (cam, size) in enumerate(zip(cameras, sizes, strict=True)):
        out[v, ..., :2] *= np.divide(cam.size, size)
    return out


def landmarks_2d(video: Path, frames: int) -> tuple[np.ndarray, tuple[int, int]]:
    """float64 [T, 308, 3] (x, y, score; NaN where no person) and the decoded size."""
    found = video_people(video, max_people=1, frames=frames, fps=FPS)
    if not found.track_ids:
        return np.full((len(found.keypoints), 308, 3), np.nan), found.size
    return found.keypoints[:, 0], found.size


def landmarks(demo: str = "Demo_SinglePerson", frames: int = 0):
    """The four views' 2D keypoints float64 [V, T, 308, 3] (cut to the shortest video), their
    decoded sizes and the seconds it took."""
    t0 = time.perf_counter()
    videos = [pose2sim_demo(demo) / "videos" / f"{c}.mp4" for c in POSE2SIM_CAMERAS]
    runs = [landmarks_2d(v, frames) for v in videos]
    n = min(len(k) for k, _ in runs)
    keypoints = np.stack([k[:n] for k, _ in runs])
    return keypoints, [s for _, s in runs], time.perf_counter() - t0


def measure(
    cameras: list[Camera],
    keypoints: np.ndarray,
    sizes: list[tuple[int, int]],
    seconds: float,
    swap_sides: bool = False,
    consistency: bool = False,
    fit_bones: bool = False,
) -> Demo3D:
    swapped = np.zeros(keypoints.shape[:2], bool)
    if swap_sides:
        keypoints, swapped = unswap_views(cameras, keypoints)
    tri = triangulate(cameras, keypoints)  # every frame at once: frames as the P axis
    chosen = None
    if consistency:  # in place, as the rig3d stage does
        params = ConsistencyParams(fit=BoneFitParams() if fit_bones else None)
        chosen = hold_clip(
            cameras, keypoints, tri, FPS, params, MIN_CONFIDENCE, MAX_ERROR_PX, MIN_VIEWS
        )
    points, used = tri.points, tri.used.transpose(2, 0, 1)  # [T, K, 3], [V, T, K]
    body = np.zeros(308, bool)
    body[BODY_IDX] = True
    seen = np.isfinite(keypoints).all(-1) & (keypoints[..., 2] >= MIN_CONFIDENCE)
    xy = keypoints[..., :2]
    error_used = reprojection_errors(cameras, points, xy, used & body)
    error_seen = reprojection_errors(cameras, points, xy, seen & body)
    offsets = reprojection_offsets(cameras, points, xy, used & body)
    lengths = limb_lengths(points)
    limb_cv = {name: coefficient_of_variation(lengths[name]) for name, _, _ in LIMBS}
    return Demo3D(
        cameras,
        sizes,
        keypoints,
        points,
        used,
        error_used,
        error_seen,
        offsets,
        limb_cv,
        seconds,
        swapped,
        chosen,
    )


def run(
    demo: str = "Demo_SinglePerson",
    frames: int = 0,
    raw_distortion: bool = False,
    swap_sides: bool = False,
    consistency: bool = False,
    calibration: Path | None = None,
    rescale: bool = False,
    fit_bones: bool = False,
) -> Demo3D:
    if calibration is not None:
        cameras = file_cameras(calibration)
    else:
        cameras = qualisys_cameras(demo, raw_distortion)
    keypoints, sizes, seconds = landmarks(demo, frames)
    if rescale:
        keypoints = rescaled(keypoints, cameras, sizes)
    return measure(
        cameras,
        keypoints,
        sizes,
        seconds,
        swap_sides=swap_sides,
        consistency=consistency,
        fit_bones=fit_bones,
    )


@dataclass
class Agreement:
    """npucam's body points against Pose2Sim's triangulation of the same 2D: distances in mm
    where both triangulated, and the points only one of them did."""

    mm: np.ndarray
    only_npucam: int
    only_pose2sim: int

    def line(self) -> str:
        return (
            f"against Pose2Sim's triangulation: median {np.median(self.mm):.2f} mm, 99th "
            f"percentile {np.percentile(self.mm, 99):.2f} mm, largest {self.mm.max():.1f} mm over "
            f"{len(self.mm)} body points; {self.only_npucam} triangulated by npucam only, "
            f"{self.only_pose2sim} by Pose2Sim only"
        )


def pose2sim_agreement(result: Demo3D) -> Agreement:
    """Pose2Sim's triangulation_from_best_cameras on result's 2D keypoints and calibration."""
    if not REFERENCE_PYTHON.is_file():
        raise RuntimeError(
            f"{REFERENCE_PYTHON}: the Pose2Sim reference venv is missing; run `make setup-test`"
        )
    with tempfile.TemporaryDirectory() as tmp:
        calib, kp, out = (Path(tmp) / n for n in ("Calib.toml", "kp.npz", "points.npz"))
        write_calibration(calib, Calibration({c.name: c for c in result.cameras}))
        np.savez(kp, keypoints=result.keypoints)
        cmd = [
            str(REFERENCE_PYTHON),
            str(REFERENCE_SCRIPT),
            "triangulate",
            str(calib),
            str(kp),
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise RuntimeError(f"{REFERENCE_SCRIPT} triangulate failed: {proc.stderr[-2000:]}")
        with np.load(out) as data:
            theirs = data["points"][:, BODY_IDX]
    ours = result.points[:, BODY_IDX]
    a, b = np.isfinite(ours).all(-1), np.isfinite(theirs).all(-1)
    mm = np.linalg.norm(ours[a & b] - theirs[a & b], axis=-1) * 1000
    return Agreement(mm, int((a & ~b).sum()), int((b & ~a).sum()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", default="Demo_SinglePerson")
    ap.add_argument("--frames", type=int, default=0, help="first N frames (default: all)")
    ap.add_argument("--raw-distortion", action="store_true")
    ap.add_argument("--swap-sides", action="store_true", help="undo a view's left/right swaps")
    ap.add_argument(
        "--consistency", action="store_true", help="hold keypoints to top speed and bone lengths"
    )
    ap.add_argument(
        "--fit-bones", action="store_true", help="with --consistency: fit the bone lengths"
    )
    ap.add_argument("--pose2sim", action="store_true", help="compare with Pose2Sim's 3D")
    ap.add_argument(
        "--calibration", type=Path, help="cameras from this file instead of Calib.qca.txt"
    )
    ap.add_argument(
        "--rescale", action="store_true", help="keypoints scaled to each calibrated size"
    )
    args = ap.parse_args()
    if args.calibration is not None and args.raw_distortion:
        ap.error("--raw-distortion changes the Qualisys import; not with --calibration")
    if args.fit_bones and not args.consistency:
        ap.error("--fit-bones fits the lengths --consistency keeps; give both")
    result = run(
        args.demo,
        args.frames,
        args.raw_distortion,
        args.swap_sides,
        args.consistency,
        args.calibration,
        args.rescale,
        args.fit_bones,
    )
    for line in result.lines():
        print(line)
    if args.pose2sim:
        print(pose2sim_agreement(result).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
