"""`npucam calibrate`: a rig's calibration file from a ChArUco board (or a checkerboard), from
another tool's file (`calibrate import`), or from people moving through the rig (`calibrate
people`: stages.rig.people_calibration).

`calibrate --camera NAME=URL [--camera ...] --out Calib.toml` reads each camera (any camera
url: image folders, video files, usb:N, rtsp://..., zmq:...; stages.rig.collect), finds the
board in its frames (stages.rig.board), calibrates each camera's lens from its views, chains
the cameras through the captures where several see the board at once, refines every pose
together (stages.rig.calibrate), prints per camera the views used and the reprojection RMS,
and writes Pose2Sim's / anipose's TOML (stages.rig.calibration). One camera: its lens only,
at the world's origin. Exit codes: 0 written, 2 an error naming the camera or argument.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from pipeline.config import NAME_PATTERN
from pipeline.errors import NpucamError
from stages.landmarks.video import video_people
from stages.rig import collect
from stages.rig.board import Board, Charuco, Checkerboard
from stages.rig.calibrate import (
    CameraViews,
    Intrinsics,
    calibrate_intrinsics,
    calibrate_rig,
)
from stages.rig.calibration import (
    Calibration,
    CalibrationError,
    Camera,
    read_calibration,
    write_calibration,
)
from stages.rig.importers import IMPORTERS, REFUSED, import_calibration
from stages.rig.people_calibration import calibrate_from_people
from stages.sources import CameraSpec


class CalibrateCommandError(NpucamError):
    """An argument of `npucam calibrate` that cannot be used; names it."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="calibrate a rig from a ChArUco board: intrinsics, extrinsics, a Calib.toml",
        description="Calibrate a rig's cameras from views of a ChArUco board (docs/rig.md) and "
        "write Pose2Sim's / anipose's calibration TOML.",
    )
    p.add_argument(
        "--camera",
        action="append",
        metavar="NAME=URL",
        help="a camera and its source (images:DIR, a video file, usb:N, rtsp://..., zmq:...); "
        "repeat for each camera. Recorded sources pair their f-th frames; live ones are "
        "grouped by capture time",
    )
    p.add_argument("--out", metavar="FILE", help="the calibration file to write")
    p.add_argument("--board", choices=("charuco", "checkerboard"), default="charuco")
    p.add_argument("--squares", default="7x5", metavar="CxR", help="ChArUco squares (default 7x5)")
    p.add_argument(
        "--corners", default="8x5", metavar="CxR", help="checkerboard inner corners (8x5)"
    )
    p.add_argument(
        "--square-length", type=float, default=0.08, metavar="M", help="square side, metres"
    )
    p.add_argument(
        "--marker-length", type=float, default=0.06, metavar="M", help="ArUco marker side, m"
    )
    p.add_argument("--dictionary", default="DICT_4X4_50", help="OpenCV ArUco dictionary")
    p.add_argument(
        "--world-view",
        type=int,
        default=None,
        metavar="F",
        help="put the world on the board as seen in capture F (a board on the floor gives a "
        "Z-up world); default: camera 1's frame",
    )
    p.add_argument(
        "--intrinsics",
        metavar="FILE",
        help="take each camera's lens (matrix, distortions) from this calibration file, by "
        "camera name, and calibrate the poses only",
    )
    p.add_argument("--k3", action="store_true", help="also estimate k3 (default: held at 0)")
    p.add_argument(
        "--every", type=int, default=1, metavar="N", help="recorded: use every N-th frame"
    )
    p.add_argument(
        "--captures", type=int, default=20, metavar="N", help="live: captures to take (20)"
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="live: seconds between captures; move the board meanwhile (1.0)",
    )
    p.add_argument(
        "--duration", type=float, default=300.0, metavar="S", help="live: give up after S s"
    )
    p.add_argument(
        "--fps", type=float, default=30.0, metavar="F", help="live: the cameras' frame rate"
    )
    p.set_defaults(func=cmd_calibrate)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    imp = actions.add_parser(
        "import",
        help="convert another tool's calibration (Qualisys, Vicon, EasyMocap, bioCV, OpenCap, "
        "anipose, ...) to a Calib.toml",
        description="Convert a calibration file as Pose2Sim's calibration.py converts it "
        "(docs/rig.md, \"Importing a calibration\") and write Pose2Sim's / anipose's TOML.",
    )
    imp.add_argument(
        "format",
        choices=sorted([*IMPORTERS, *REFUSED]),
        metavar="FORMAT",
        help=f"one of {', '.join(IMPORTERS)}",
    )
    imp.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="the file; easymocap: intri.yml and extri.yml; biocv, opencap: one file per camera",
    )
    imp.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    imp.add_argument(
        "--binning", type=int, default=1, metavar="N", help="Qualisys: the binning factor (1)"
    )
    imp.set_defaults(func=cmd_import)
    ppl = actions.add_parser(
        "people",
        help="a synchronised rig's extrinsics from people moving through it (no board)",
        description="Calibrate the cameras' poses from the body keypoints of one person seen "
        'by every camera at once (docs/rig.md, "Extrinsics from people"); the lenses come '
        "from --intrinsics. Writes Pose2Sim's / anipose's TOML.",
    )
    ppl.add_argument(
        "videos",
        nargs="+",
        metavar="VIDEO",
        help="one synchronised video per camera, named by its camera (cam01.mp4 is the camera "
        "named cam01 in --intrinsics); the f-th frames of all are one instant",
    )
    ppl.add_argument(
        "--intrinsics", required=True, metavar="FILE", help="the calibration giving each lens"
    )
    scale = ppl.add_mutually_exclusive_group(required=True)
    scale.add_argument(
        "--height", type=float, metavar="M", help="scale: the person's standing height, metres"
    )
    scale.add_argument(
        "--distance",
        nargs=3,
        metavar=("CAM_A", "CAM_B", "M"),
        help="scale: the distance between two cameras' centres, metres",
    )
    ppl.add_argument("--frames", type=int, default=0, metavar="N", help="first N frames (all)")
    ppl.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    ppl.set_defaults(func=cmd_people)


def _size(text: str, option: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m:
        raise CalibrateCommandError(f"{option} {text!r}: expected COLUMNSxROWS, e.g. 7x5")
    return int(m[1]), int(m[2])


def board_of(args: argparse.Namespace) -> Board:
    if args.board == "checkerboard":
        return Checkerboard(_size(args.corners, "--corners"), args.square_length)
    return Charuco(
        _size(args.squares, "--squares"), args.square_length, args.marker_length, args.dictionary
    )


def camera_specs(values: list[str]) -> list[CameraSpec]:
    specs = []
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not re.fullmatch(NAME_PATTERN, name) or not url:
            raise CalibrateCommandError(
                f"--camera {value!r}: expected NAME=URL, NAME of letters, digits, '_' and '-'"
            )
        if any(s.name == name for s in specs):
            raise CalibrateCommandError(f"--camera {value!r}: camera {name!r} is given twice")
        specs.append(CameraSpec(name, url, base_dir=Path.cwd()))
    live = [s.name for s in specs if s.live]
    if live and len(live) != len(specs):
        recorded = [s.name for s in specs if not s.live]
        raise CalibrateCommandError(
            f"cameras {', '.join(live)} are live and {', '.join(recorded)} recorded: frames "
            "can be paired by frame number (recorded) or by capture time (live), not both"
        )
    return specs


def _given_intrinsics(path: str, views: list[CameraViews]) -> list[Intrinsics]:
    calibration = read_calibration(path)
    out = []
    for cam in views:
        lens = calibration.camera(cam.name)
        if tuple(lens.size) != tuple(cam.size):
            raise CalibrationError(
                f"camera {cam.name!r}: its images are {cam.size[0]}x{cam.size[1]} but {path} "
                f"calibrates it at {lens.size[0]}x{lens.size[1]}"
            )
        out.append(Intrinsics(lens.matrix, lens.distortions, float("nan"), 0))
    return out


def _say(text: str) -> None:
    print(text, flush=True)


def cmd_import(args: argparse.Namespace) -> int:
    calibration = import_calibration(args.format, args.files, args.binning)
    for cam in calibration.cameras.values():
        fx, fy, cx, cy = (cam.matrix[i, j] for i, j in ((0, 0), (1, 1), (0, 2), (1, 2)))
        x, y, z = cam.centre
        _say(
            f"{cam.name}: {cam.size[0]}x{cam.size[1]}, f {fx:.1f} {fy:.1f} px, centre "
            f"{cx:.1f} {cy:.1f} px, at ({x:.3f}, {y:.3f}, {z:.3f})"
        )
    write_calibration(args.output, calibration)
    _say(f"wrote {args.output} ({len(calibration.cameras)} cameras)")
    return 0


def _distance(values: list[str] | None) -> tuple[str, str, float] | None:
    if values is None:
        return None
    first, second, metres = values
    try:
        return first, second, float(metres)
    except ValueError:
        raise CalibrateCommandError(
            f"--distance {' '.join(values)}: {metres!r} is not metres"
        ) from None


def cmd_people(args: argparse.Namespace) -> int:
    distance = _distance(args.distance)
    lenses_file = read_calibration(args.intrinsics)
    names = [Path(v).stem for v in args.videos]
    if len(set(names)) != len(names):
        raise CalibrateCommandError(f"two videos name the same camera: {', '.join(names)}")
    keys = {cam.name: key for key, cam in lenses_file.cameras.items()}
    lenses = [lenses_file.camera(name) for name in names]
    views = []
    for video, lens in zip(args.videos, lenses, strict=True):
        found = video_people(video, max_people=1, frames=args.frames, hands=True)
        kp = (
            found.keypoints[:, 0]
            if found.track_ids
            else np.full((len(found.keypoints), 308, 3), np.nan)
        )
        if found.size != lens.size:
            # the video is taken as the calibrated image resized: scale its pixels back
            kp[..., :2] *= np.divide(lens.size, found.size)
            _say(
                f"{lens.name}: {video} decodes as {found.size[0]}x{found.size[1]}, the lens is "
                f"calibrated at {lens.size[0]}x{lens.size[1]}: keypoints rescaled to it"
            )
        seen = int(np.isfinite(kp[..., 2]).any(-1).sum())
        _say(f"{lens.name}: a person in {seen} of {len(kp)} frames of {video}")
        views.append(kp)
    frames = min(len(v) for v in views)
    keypoints = np.stack([v[:frames] for v in views])
    result = calibrate_from_people(lenses, keypoints, height=args.height, distance=distance)
    for pair in result.pairs:
        _say(
            f"{names[pair.a]}-{names[pair.b]}: {pair.inliers} of {pair.matched} matched "
            "keypoints agree with the essential matrix"
        )
    for v, (name, rms) in enumerate(zip(names, result.camera_rms, strict=True)):
        mirrored = int(result.swapped[v].sum())
        _say(
            f"{name}: RMS {rms:.2f} px after the bundle adjustment; sides swapped on "
            f"{mirrored} frames"
        )
    _say(
        f"bundle adjustment: RMS {result.rms:.2f} px over {result.observations - result.outliers} "
        f"observations ({result.outliers} outliers); scale from the {result.scale_from}; world: "
        f"{names[0]}'s frame"
    )
    cameras = {keys[c.name]: c for c in result.calibration.cameras.values()}
    write_calibration(args.output, Calibration(cameras, result.calibration.metadata))
    _say(f"wrote {args.output}")
    return 0


def _lenses_only(views: list[CameraViews], intrinsics: list[Intrinsics]) -> Calibration:
    """Each camera's lens from its own checkerboard images (which need not be one instant:
    a checkerboard's corners have no identity across cameras, so it gives no extrinsics),
    every camera at the world origin; `--intrinsics` takes the lenses back for a ChArUco run."""
    cameras = {}
    for i, (cam, intr) in enumerate(zip(views, intrinsics, strict=True)):
        _say(f"{cam.name}: intrinsics from {intr.views} views, RMS {intr.rms:.3f} px")
        cameras[f"cam_{i + 1:02d}"] = Camera(
            cam.name, cam.size, intr.matrix, intr.distortions, np.zeros(3), np.zeros(3)
        )
    _say(
        "checkerboard: lenses only, every camera at the world origin (no extrinsics); pass "
        "this file to --intrinsics to solve the poses from a ChArUco board, or import them"
    )
    return Calibration(cameras, {"adjusted": False, "error": max(i.rms for i in intrinsics)})


def cmd_calibrate(args: argparse.Namespace) -> int:
    missing = [o for o in ("camera", "out") if getattr(args, o) is None]
    if missing:
        raise CalibrateCommandError(
            f"calibrate: --{' and --'.join(missing)} required (or `npucam calibrate import`)"
        )
    board = board_of(args)
    specs = camera_specs(args.camera)
    for option in ("every", "captures"):
        if getattr(args, option) < 1:
            raise CalibrateCommandError(f"--{option}: expected at least 1")
    if specs[0].live:
        views = collect.live(
            board, specs, args.fps, args.captures, args.interval, args.duration, _say
        )
    else:
        views = collect.recorded(board, specs, args.every, progress=_say)
    for cam in views:
        found = sum(v is not None for v in cam.views)
        _say(f"{cam.name}: board found in {found} of {len(cam.views)} images")
    fix_k3 = not args.k3
    intrinsics = (
        _given_intrinsics(args.intrinsics, views)
        if args.intrinsics
        else [calibrate_intrinsics(board, cam, fix_k3) for cam in views]
    )
    if isinstance(board, Checkerboard) and len(views) > 1:
        calibration = _lenses_only(views, intrinsics)
    elif len(views) == 1:
        lens, intr = views[0], intrinsics[0]
        camera = Camera(
            lens.name, lens.size, intr.matrix, intr.distortions, np.zeros(3), np.zeros(3)
        )
        calibration = Calibration({"cam_01": camera}, {"adjusted": False, "error": intr.rms})
        _say(
            f"{lens.name}: intrinsics from {intr.views} views, RMS {intr.rms:.3f} px (one camera: "
            "no extrinsics, the world is its frame)"
        )
    else:
        rig = calibrate_rig(board, views, intrinsics, args.world_view, fix_k3)
        for r in rig.cameras:
            lens_text = (
                f"lens from {args.intrinsics}"
                if args.intrinsics
                else f"intrinsics from {r.intrinsic_views} views, RMS {r.intrinsic_rms:.3f} px"
            )
            _say(f"{r.name}: {lens_text}; {r.shared_views} shared views, RMS {r.rms:.3f} px")
        _say(f"bundle adjustment: RMS {rig.rms:.3f} px over {len(rig.cameras)} cameras")
        calibration = rig.calibration
    write_calibration(args.out, calibration)
    _say(f"wrote {args.out}")
    return 0
