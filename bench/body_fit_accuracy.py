"""The body fit's accuracy on the synthetic walk for other phenotypes than the test's: the
tests/stages/body/test_fit.py measures (joint-angle error, fitted against triangulated
keypoint error) for random phenotypes, printed per phenotype with the bars they face
(median angle <= 5 degrees; keypoint error <= 1.2x the triangulation's).

Scene: tests/stages/body/body_scenes.py (Pose2Sim's 4 demo cameras, 1 px noise, 60 frames).

Run: .venv/bin/python bench/body_fit_accuracy.py [--seeds 1 2 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from scipy.spatial.transform import Rotation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "stages" / "body"))
from body_scenes import observe, walk_and_wave  # noqa: E402

from pipeline.assets import ANNY_MODEL, asset_path  # noqa: E402
from stages.body.fit import FITTED_BONES, BodyTracker  # noqa: E402
from stages.body.model import AnnyModel  # noqa: E402

FRAMES = 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    model = AnnyModel.load(asset_path(ANNY_MODEL))
    bones = [0] + [model.bone(b) for b in FITTED_BONES]
    truth = walk_and_wave(model, FRAMES)
    for seed in args.seeds:
        phenotype = np.random.default_rng(seed).uniform(0.1, 0.9, 6)
        seen = observe(model, phenotype, truth, noise_px=1.0, seed=seed)
        tracker = BodyTracker(model)
        fits = [tracker.update(seen.points308[f], seen.confidence308[f]) for f in range(FRAMES)]
        window = tracker.config.window
        fitted = np.stack([f.keypoints for f in fits])
        fit = np.linalg.norm(fitted - seen.truth, axis=-1)
        tri = np.linalg.norm(seen.triangulated - seen.truth, axis=-1)
        angles = [
            np.degrees(Rotation.from_matrix(f.pose.rotations[b].T @ t.rotations[b]).magnitude())
            for f, t in zip(fits, truth, strict=True)
            for b in bones
        ]
        ratio = fit[window:].mean() / tri[window:].mean()
        angle = float(np.median(angles))
        print(f"seed {seed}: phenotype {np.round(phenotype, 2)}")
        print(f"  fitted phenotype {np.round(fits[-1].phenotype, 2)}")
        print(f"  joint-angle median {angle:.2f} deg (<= 5: {'met' if angle <= 5 else 'NOT met'})")
        print(
            f"  after the window: fit {fit[window:].mean() * 1e3:.2f} mm, triangulation "
            f"{tri[window:].mean() * 1e3:.2f} mm, {ratio:.2f}x "
            f"(<= 1.2: {'met' if ratio <= 1.2 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
