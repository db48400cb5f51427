"""stages/landmarks against MediaPipe's own Holistic graph (mediapipe 0.10.21, run in the
reference venv by bench/mediapipe_reference.py) on the same frames of the sample clips: body and
hand landmarks within 1.5% of body height on average, the issue's bound (docs/live-pose.md has
the figures and p95). MediaPipe's side of the default clips is run once by `make setup-test`
(tests/stages/landmarks/mediapipe_reference.py); the slow bikes test runs it here.

Where a person is in view the two agree far closer (0.04-0.20% measured): MediaPipe runs the
same .tflite files through the same crop, decode and ROI arithmetic, so what is left is float
rounding in the warp and the model. FAITHFUL = 0.5% holds them to that, so a changed ROI rule
(the heatmap kernel, the one-euro filter's beta) fails here even where 1.5% would not.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.assets import asset_path
from tests.stages.landmarks import mediapipe_reference

MAX_MEAN = 1.5  # % of body height
FAITHFUL = 0.5


@pytest.fixture(scope="module")
def compare(tmp_path_factory):
    bench = mediapipe_reference.bench()
    cache: dict[str, object] = {}

    def run(clip: str):
        if clip not in cache:
            path = asset_path(clip)
            if clip in mediapipe_reference.CLIPS:
                built = mediapipe_reference.path(clip)
                assert built.is_file(), f"{built}: run `make setup-test`"
                with np.load(built) as data:
                    ref = {k: data[k] for k in data.files}
            else:
                out = tmp_path_factory.mktemp("reference") / f"{clip}.npz"
                ref = bench.run_reference(path, out, "holistic")
            ours = bench.run_npucam(path, ("body", "hands"))
            cache[clip] = bench.agreement(ours, ref)
            print(cache[clip].line(clip))
        return cache[clip]

    return run


def on_one_worker(*clips: str) -> list:
    """The clips as parameters each tied to one xdist worker (Makefile: --dist loadgroup), so
    a clip's body and hand tests share the module's one run of it."""
    return [pytest.param(clip, marks=pytest.mark.xdist_group(clip)) for clip in clips]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "clip",
    on_one_worker(
        "carphone_pristine.mp4", "pose2sim_single_cam01.mp4", "pose2sim_single_cam03.mp4"
    ),
)
def test_body_landmarks_agree_with_mediapipe_on_a_person_in_view(compare, clip):
    a = compare(clip)
    assert a.both >= 0.95 * a.frames, a.line(clip)  # both follow the person on the same frames
    assert a.other_person == 0, a.line(clip)
    assert a.body_mean <= MAX_MEAN and a.body_mean <= FAITHFUL, a.line(clip)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "clip", on_one_worker("pose2sim_single_cam01.mp4", "pose2sim_single_cam03.mp4")
)
def test_hand_landmarks_agree_with_mediapipe(compare, clip):
    # the 176x144 carphone and the bikes riders show no hand MediaPipe finds (0 and 3 frames)
    a = compare(clip)
    assert a.hand_frames >= 100, a.line(clip)
    assert a.hand_mean <= MAX_MEAN and a.hand_mean <= FAITHFUL, a.line(clip)


@pytest.mark.slow  # 250 frames through both graphs (~20 s), for a known gap: the slow run
@pytest.mark.timeout(600)
@pytest.mark.xfail(
    strict=True,
    reason="bikes: on riders cut by the frame edge the landmark model is unstable, and float "
    "rounding between the two runs grows through the ROI feedback from frame 3 on: body mean "
    "6.6% (docs/live-pose.md)",
)
def test_body_landmarks_agree_with_mediapipe_on_bikes(compare):
    a = compare("bikes.mp4")
    assert a.body_mean <= MAX_MEAN, a.line("bikes.mp4")
