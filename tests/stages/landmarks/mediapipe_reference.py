"""MediaPipe's Holistic graph (the reference venv, bench/mediapipe_reference.py) on the clips
tests/stages/landmarks/test_landmarks_reference.py compares against, run once into the ignored
asset cache: ~20 s a clip, which the tests no longer pay (each xdist worker ran it again).
`make setup-test` writes them (`python -m tests.stages.landmarks.mediapipe_reference`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from pipeline.assets import asset_path, cache_dir

BENCH = Path(__file__).resolve().parents[3] / "bench" / "landmark_agreement.py"
CLIPS = ("carphone_pristine.mp4", "pose2sim_single_cam01.mp4", "pose2sim_single_cam03.mp4")


def bench() -> ModuleType:
    """bench/landmark_agreement.py, which runs both sides and compares them."""
    spec = importlib.util.spec_from_file_location("landmark_agreement", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def path(clip: str) -> Path:
    """Where the Holistic graph's landmarks of `clip` are kept."""
    return cache_dir() / "mediapipe-reference" / f"{clip}-holistic.npz"


def build() -> None:
    """Run the graph on every clip of CLIPS into path(clip)."""
    run_reference = bench().run_reference
    for clip in CLIPS:
        out = path(clip)
        out.parent.mkdir(parents=True, exist_ok=True)
        run_reference(asset_path(clip), out, "holistic")


if __name__ == "__main__":
    build()
