"""Triangulation of 3 people x 308 keypoints x 4 views against per-keypoint references, in one
process, on one core.

Scene: tests/stages/rig/rig_scenes.py's (4 distorting 1920x1080 cameras ~3 m away, 1 px noise,
one view per keypoint occluded or moved 80-300 px), so the rejection rule runs as in use.
  1. stages.rig.triangulate.triangulate (batched normal equations, Pose2Sim's rule) vs the
     same rule as a per-keypoint loop: Pose2Sim's weighted_triangulation (np.linalg.svd of the
     confidence-weighted DLT rows) per point and per subset tried. Both start from the same
     undistorted points (Camera.normalize per camera).
  2. Two views, every camera pair: cv2.triangulatePoints on all 924 points of a pair vs ours
     on the same two views (clean points, equal confidences); both undistort first, ours also
     scores the reprojection error. Linear-LS (ours) and the homogeneous SVD (cv2) agree to
     noise level, but for nearly opposite cameras, whose rays are nearly parallel.
Times are best of --repeat runs; the max |diff| of the points is printed with each ratio.
Target: ours <= 5 ms for the 3 x 308 x 4 set, and faster than the loop.

Run: .venv/bin/python bench/triangulate.py [--repeat 50]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
from itertools import combinations  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from timing import best_of  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "stages" / "rig"))
from rig_scenes import corrupt, observe, people, ring_cameras  # noqa: E402

from stages.rig.triangulate import MAX_ERROR_PX, MIN_CONFIDENCE, triangulate  # noqa: E402

cv2.setNumThreads(1)


def loop_triangulate(cams, keypoints: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pose2Sim's rule one keypoint at a time -> (points [N, 3], used [N, V])."""
    n_views = len(cams)
    flat = keypoints.reshape(n_views, -1, 3)
    valid = np.isfinite(flat).all(-1) & (flat[..., 2] >= MIN_CONFIDENCE) & (flat[..., 2] > 0)
    seen = np.stack(
        [c.normalize(np.where(valid[v, :, None], flat[v, :, :2], 0)) for v, c in enumerate(cams)]
    )
    ext = [c.extrinsics for c in cams]
    focal = [np.diag(c.matrix)[:2] for c in cams]
    points = np.full((flat.shape[1], 3), np.nan)
    used = np.zeros((flat.shape[1], n_views), bool)
    for n in range(flat.shape[1]):
        views = np.flatnonzero(valid[:, n])
        err = np.inf
        for k in range(len(views) - 1):
            if err <= MAX_ERROR_PX:
                break
            err = np.inf
            for keep in combinations(views, len(views) - k):
                rows = []
                for v in keep:
                    x, y = seen[v, n]
                    w = flat[v, n, 2]
                    rows += [(x * ext[v][2] - ext[v][0]) * w, (y * ext[v][2] - ext[v][1]) * w]
                q = np.linalg.svd(np.array(rows))[2][-1]
                q = q[:3] / q[3]
                e = 0.0
                for v in keep:
                    local = ext[v][:, :3] @ q + ext[v][:, 3]
                    off = (local[:2] / local[2] - seen[v, n]) * focal[v]
                    e += np.hypot(*off) if local[2] > 0 else np.inf
                if e / len(keep) < err:
                    err, best, best_keep = e / len(keep), q, keep
        if err <= MAX_ERROR_PX:
            points[n] = best
            used[n, list(best_keep)] = True
    return points, used


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cams = ring_cameras(rng)
    truth = people(rng, 3)
    clean = observe(cams, truth, rng)
    seen, _, _ = corrupt(clean, rng)

    ours = triangulate(cams, seen)
    t_ours = best_of(args.repeat, lambda: triangulate(cams, seen))
    ref_points, ref_used = loop_triangulate(cams, seen)
    t_loop = best_of(max(3, args.repeat // 10), lambda: loop_triangulate(cams, seen))
    diff = np.nanmax(np.abs(ours.points.reshape(-1, 3) - ref_points))
    same_used = (ours.used.reshape(-1, 4) == ref_used).all(1).mean()
    err = np.linalg.norm(ours.points - truth, axis=-1)
    print(f"3 people x 308 keypoints x 4 views, one core, ours best of {args.repeat}")
    print(f"  ours (batched)                 {t_ours * 1e3:8.2f} ms")
    print(
        f"  per-keypoint loop (svd)        {t_loop * 1e3:8.2f} ms   loop / ours = "
        f"{t_loop / t_ours:.1f}x   max |diff| {diff * 1e3:.4f} mm, same views "
        f"{100 * same_used:.1f}%"
    )
    print(
        f"  3D error vs truth: mean {np.nanmean(err) * 1e3:.2f} mm, "
        f"{np.isnan(err).sum()} of {err.size} not triangulated"
    )

    pairs = list(combinations(range(4), 2))
    equal = clean.copy()  # a moved view makes two rays meaningless: the two methods then part
    equal[..., 2] = 1.0

    def cv2_pairs():
        out = []
        for a, b in pairs:
            xa, xb = (cams[v].normalize(equal[v, ..., :2].reshape(-1, 2)).T for v in (a, b))
            out.append(cv2.triangulatePoints(cams[a].extrinsics, cams[b].extrinsics, xa, xb))
        return out

    def our_pairs():
        return [
            triangulate([cams[a], cams[b]], equal[[a, b]], max_error=np.inf).points
            for a, b in pairs
        ]

    t_cv2 = best_of(args.repeat, cv2_pairs)
    t_pair = best_of(args.repeat, our_pairs)
    pair_diff = np.concatenate(
        [
            np.linalg.norm(o.reshape(-1, 3) - (r[:3] / r[3]).T, axis=1)
            for o, r in zip(our_pairs(), cv2_pairs(), strict=True)
        ]
    )
    print("two views, 924 points, all 6 camera pairs, both undistorting first")
    print(f"  ours (+ reprojection error)    {t_pair * 1e3:8.2f} ms")
    print(
        f"  cv2.triangulatePoints          {t_cv2 * 1e3:8.2f} ms   cv2 / ours = "
        f"{t_cv2 / t_pair:.2f}x   |diff| median {np.median(pair_diff) * 1e3:.4f} mm, "
        f"max {pair_diff.max() * 1e3:.3f} mm"
    )
    met = t_ours <= 5e-3 and t_ours < t_loop
    print(f"target (ours <= 5 ms and faster than the loop): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
