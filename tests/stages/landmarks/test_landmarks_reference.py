"""stages/landmarks against MediaPipe's own Holistic graph (mediapipe 0.10.21, run in the
reference venv by bench/mediapipe_reference.py) on the same frames of the sample clips: body and
hand landmarks within 1.5% of body height on average (docs/live-pose.md has the figures and p95).

Tolerance: MediaPipe runs the same .tflite files through its own crop and XNNPACK; the crop and
projection are the same maths, so what is left is float rounding in the warp and the model, a
few pixels on a 1000-pixel person. 1.5% is the issue's bound.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from pipeline.assets import asset_path

BENCH = Path(__file__).resolve().parents[3] / "bench" / "landmark_agreement.py"
MAX_MEAN = 1.5  # % of body height


def _bench():
    spec = importlib.util.spec_from_file_location("landmark_agreement", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compare(tmp_path_factory):
    bench = _bench()
    cache: dict[str, object] = {}

    def run(clip: str):
        if clip not in cache:
            path = asset_path(clip)
            out = tmp_path_factory.mktemp("reference") / f"{clip}.npz"
            ref = bench.run_reference(path, out, "holistic")
            ours = bench.run_npucam(path, ("body", "hands"))
            cache[clip] = bench.agreement(ours, ref)
            print(cache[clip].line(clip))
        return cache[clip]

    return run


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "clip", ["carphone_pristine.mp4", "pose2sim_single_cam01.mp4", "pose2sim_single_cam03.mp4"]
)
def test_body_landmarks_agree_with_mediapipe_on_a_person_in_view(compare, clip):
    a = compare(clip)
    assert a.both >= 0.95 * a.frames, a.line(clip)  # both follow the person on the same frames
    assert a.other_person == 0, a.line(clip)
    assert a.body_mean <= MAX_MEAN, a.line(clip)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("clip", ["pose2sim_single_cam01.mp4", "pose2sim_single_cam03.mp4"])
def test_hand_landmarks_agree_with_mediapipe(compare, clip):
    # the 176x144 carphone and the bikes riders show no hand MediaPipe finds (0 and 3 frames)
    a = compare(clip)
    assert a.hand_frames >= 100, a.line(clip)
    assert a.hand_mean <= MAX_MEAN, a.line(clip)


@pytest.mark.timeout(600)
@pytest.mark.xfail(
    strict=True,
    reason="bikes: riders cut by the frame edge and scene cuts; the two lose and re-find people "
    "on different frames (pose flag 0.45 here, >= 0.5 in MediaPipe at frame 2), so their ROIs "
    "part ways: body mean 3.4% (docs/live-pose.md)",
)
def test_body_landmarks_agree_with_mediapipe_on_bikes(compare):
    a = compare("bikes.mp4")
    assert a.body_mean <= MAX_MEAN, a.line("bikes.mp4")
