"""The body fit's steady-state cost per person-frame on one core, against the same fit on the
unfolded rig in the same process.

Scene: tests/stages/body/body_scenes.py (an ANNY person walking and waving, its mapped
keypoints seen by Pose2Sim's 4 demo cameras with 1 px noise and triangulated). Two
BodyTrackers run the whole sequence; per-frame wall times are taken after the phenotype
window (steady state: the phenotype held, the pose warm-started):
  1. ours: stages.body.fit.PoseSolver as the stage uses it, chaining the root and the 14
     fitted bones with the other 89 bones folded onto them (stages/body/chain.py);
  2. the reference: the same LM, Jacobian and steps chaining all 104 bones each step.
Both give the same fit (max |diff| of the fitted points is printed). Target: ours <= 10 ms.

With --fingers, the same with FitConfig.fingers (the finger joints mapped, the finger bones
turned after the window).

Run: .venv/bin/python bench/body_fit.py [--frames 150] [--fingers]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "stages" / "body"))
from body_scenes import PHENOTYPE, observe, walk_and_wave  # noqa: E402

from pipeline.assets import ANNY_MODEL, asset_path  # noqa: E402
from stages.body.fit import (  # noqa: E402
    BODY_BONES,
    FINGER_BONES,
    BodyTracker,
    FitConfig,
    PoseSolver,
)
from stages.body.model import AnnyModel  # noqa: E402


def run(tracker: BodyTracker, seen, frames: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-frame wall seconds, per-frame CPU seconds of this thread (what a loaded host's
    other processes do not inflate) and fitted points [F, N, 3]."""
    times, cpu, points = [], [], []
    for f in range(frames):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fit = tracker.update(seen.points308[f], seen.confidence308[f])
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        points.append(fit.keypoints)
    return np.array(times), np.array(cpu), np.stack(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--fingers", action="store_true", help="the fit with the fingers")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    model = AnnyModel.load(asset_path(ANNY_MODEL))
    truth = walk_and_wave(model, args.frames)
    seen = observe(model, PHENOTYPE, truth, noise_px=1.0, seed=0, fingers=args.fingers)

    config = FitConfig(fingers=args.fingers)
    ours = BodyTracker(model, config)
    reference = BodyTracker(model, config)
    reference.solver = PoseSolver(
        model,
        reference.points,
        config,
        units=np.arange(model.bone_count),
        fitted=BODY_BONES + (FINGER_BONES if args.fingers else ()),
    )
    reference.solver.set_rest(model.rest(reference.phenotype, vertices=False))
    steady = ours.config.window + 1
    t_ref, c_ref, p_ref = run(reference, seen, args.frames)
    t_ours, c_ours, p_ours = run(ours, seen, args.frames)
    error = np.linalg.norm(p_ours - seen.truth, axis=-1)[steady:].mean() * 1e3
    tri = np.linalg.norm(seen.triangulated - seen.truth, axis=-1)[steady:].mean() * 1e3
    print(f"steady-state frames: {args.frames - steady} (after the {steady - 1}-frame window)")
    for name, t, c in (
        ("ours", t_ours, c_ours),
        ("reference (104 bones chained)", t_ref, c_ref),
    ):
        s, sc = t[steady:] * 1e3, c[steady:] * 1e3
        print(
            f"{name:32s} median {np.median(s):6.2f} ms  mean {s.mean():6.2f} ms  p95 "
            f"{np.percentile(s, 95):6.2f} ms per person-frame (CPU: median "
            f"{np.median(sc):6.2f} ms, p95 {np.percentile(sc, 95):6.2f} ms)"
        )
    ratio = np.median(t_ref[steady:]) / np.median(t_ours[steady:])
    print(f"ratio reference / ours (medians): {ratio:.2f}")
    print(f"load average (1 min): {os.getloadavg()[0]:.1f}")
    print(f"max |fitted points ours - reference|: {np.abs(p_ours - p_ref).max():.2e} m")
    print(f"fit error {error:.2f} mm vs triangulation {tri:.2f} mm (mean, steady state)")
    verdict = "met" if np.median(t_ours[steady:]) <= 0.010 else "NOT met"
    print(f"target <= 10 ms per person-frame (wall, median): {verdict}")


if __name__ == "__main__":
    main()
