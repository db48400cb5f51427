"""The per-frame CPU landmark path and keyframe fusion, measured without Sapiens2 weights
(docs/benchmarks.md, "Live pose"; docs/live-pose.md).

Fusion: the CPU model is its own keyframe source. Every N frames (N = 1 s and 3 s of video) a
keyframe carries every landmark; between keyframes a held-out block (the 42 hand landmarks, or
the 468 face-mesh points) is treated as keyframe-only: missing from the per-frame stream and
from the anchors, carried by stages/landmarks/fusion.py from the body's landmarks (hands: wrist,
pinky, index, thumb; face: the body's 11 face points), and compared with the same model run on
that frame. Beside it: optical flow alone (cv2.calcOpticalFlowPyrLK frame to frame from the
keyframe, forward-backward checked, a point that fails holds), and fusion refined by flow.
Errors in % of body height (the vertical extent of the 33 body landmarks on that frame), by
keyframe age; keyframe frames themselves are left out.

CPU: process CPU ms per person-frame of body, + hands, + face, and mediapipe.solutions.holistic
(its own venv, bench/mediapipe_reference.py) on the same clip in the same run; the ratio is
npucam's body + hands + face over Holistic's.

Usage: python bench/live_pose.py [CLIP ...] (asset names; default: the sample clips and
Pose2Sim's 60 fps cam01 and cam03)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from landmark_agreement import run_reference  # noqa: E402

from pipeline.assets import asset_path  # noqa: E402
from stages.landmarks import flow  # noqa: E402
from stages.landmarks.detection import PoseDetector  # noqa: E402
from stages.landmarks.fusion import KeyframeFusion, Part  # noqa: E402
from stages.landmarks.parts import FACE0, LEFT_HAND0, NUM_ANCHORS, RIGHT_HAND0, anchor_points  # noqa: E402
from stages.landmarks.tracker import LandmarkTracker  # noqa: E402

CLIPS = (
    "bikes.mp4",
    "carphone_pristine.mp4",
    "pose2sim_single_cam01.mp4",
    "pose2sim_single_cam03.mp4",
)
HELD_OUT = {
    "hands": (
        tuple(range(LEFT_HAND0, FACE0)),
        (
            Part("left_hand", tuple(range(LEFT_HAND0, RIGHT_HAND0)), ((15, 17, 19, 21),)),
            Part("right_hand", tuple(range(RIGHT_HAND0, FACE0)), ((16, 18, 20, 22),)),
        ),
    ),
    "face": (
        tuple(range(FACE0, NUM_ANCHORS)),
        (Part("head", tuple(range(FACE0, NUM_ANCHORS)), (tuple(range(11)),)),),
    ),
}
AGE_BINS_S = (0.0, 0.1, 0.5, 1.0, 2.0, 3.01)


def read_clip(path: Path) -> tuple[list[np.ndarray], float]:
    cap = cv2.VideoCapture(str(path))
    fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    return frames, fps


def run_landmarks(
    frames: list[np.ndarray], fps: float, parts: tuple[str, ...]
) -> tuple[list, float]:
    """Per frame the first person's anchor array (NaN if nobody), and CPU ms per person-frame."""
    tracker = LandmarkTracker(PoseDetector(), parts=parts, max_people=1)
    rows, cpu, people = [], 0.0, 0
    for i, frame in enumerate(frames):
        t0 = time.process_time()
        found = tracker.step(frame, (i + 1) / fps)
        cpu += time.process_time() - t0
        people += len(found)
        if not found:
            rows.append(None)
            continue
        p = found[0]
        hands = {s: (h.xy if h is not None else None) for s, h in p.hands.items()}
        face = p.face.xy if p.face is not None else None
        rows.append(
            (
                p.track_id,
                anchor_points(p.body.xy, hands.get("left"), hands.get("right"), face),
                p.body.visibility,
            )
        )
    return rows, 1000 * cpu / max(people, 1)


def evaluate(rows: list, frames: list[np.ndarray], fps: float, every: int, block: str) -> dict:
    """Per method, the held-out points' errors (% of body height) with their keyframe ages.
    Each track gets its own fusion, with a keyframe on its first frame and every `every`
    frames after, carrying whatever the model found on that frame."""
    held, parts = HELD_OUT[block]
    held = np.array(held)
    k = NUM_ANCHORS
    errs: dict[str, list[tuple[float, float]]] = {
        m: [] for m in ("fusion", "fusion+flow", "flow only")
    }
    track = start = None
    fusions: dict[str, KeyframeFusion] = {}
    flow_pts = prev_gray = last_kf = None
    for i, (row, frame) in enumerate(zip(rows, frames, strict=True)):
        gray = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
        t = (i + 1) / fps
        if row is None:
            track = None
            prev_gray = gray
            continue
        track_id, truth, _ = row
        if track_id != track:
            track, start = track_id, i
            fusions = {
                "fusion": KeyframeFusion(k, parts, history_s=1e9),
                "fusion+flow": KeyframeFusion(k, parts, history_s=1e9, use_flow=True),
            }
            flow_pts = None
        cpu = truth.copy()
        cpu[held] = np.nan
        score = np.ones(k)
        outs = {m: f.frame(t, cpu, score, cpu, gray) for m, f in fusions.items()}
        if flow_pts is not None:
            flow_pts, _ = flow.track(prev_gray, gray, flow_pts)
        if (i - start) % every == 0:
            for f in fusions.values():
                f.keyframe(t, truth, score)
            flow_pts = truth[held].copy()
            last_kf = t
        else:
            height = float(np.ptp(truth[:33, 1]))
            have = np.isfinite(truth[held]).all(axis=1)
            age = t - last_kf
            for m, out in outs.items():
                e = np.linalg.norm(out.xy[held][have] - truth[held][have], axis=1) / height * 100
                errs[m] += [(age, v) for v in e]  # NaN where fusion left a point absent
            e = np.linalg.norm(flow_pts[have] - truth[held][have], axis=1) / height * 100
            errs["flow only"] += [(age, v) for v in e]
        prev_gray = gray
    return {m: np.array(v).reshape(-1, 2) for m, v in errs.items()}


def table(errs: dict, every_s: float) -> list[str]:
    lines = []
    for method, arr in errs.items():
        if len(arr) == 0:
            lines.append(f"    {method}: no held-out points on non-keyframe frames")
            continue
        cells = []
        for lo, hi in zip(AGE_BINS_S[:-1], AGE_BINS_S[1:], strict=True):
            sel = arr[(arr[:, 0] >= lo) & (arr[:, 0] < hi)]
            if len(sel) == 0 or lo > every_s:
                continue
            v = sel[:, 1]
            placed = np.isfinite(v)
            if not placed.any():
                cells.append(f"{lo:g}-{min(hi, 3):g}s: all absent")
                continue
            cells.append(
                f"{lo:g}-{min(hi, 3):g}s: {np.nanmean(v):.1f}/{np.nanpercentile(v, 95):.1f}"
                + ("" if placed.all() else f" ({(~placed).mean():.0%} absent)")
            )
        allv = arr[:, 1]
        if not np.isfinite(allv).any():
            lines.append(f"    {method}: every held-out point absent [{'; '.join(cells)}]")
            continue
        lines.append(
            f"    {method}: mean/p95 {np.nanmean(allv):.2f}/{np.nanpercentile(allv, 95):.2f}% "
            f"[{'; '.join(cells)}] n={len(allv)}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("clips", nargs="*", default=list(CLIPS))
    args = ap.parse_args()
    print("bench/live_pose.py: errors in % of body height (mean/p95) by keyframe age")
    for name in args.clips:
        path = asset_path(name)
        frames, fps = read_clip(path)
        h, w = frames[0].shape[:2]
        print(f"\n{name}: {len(frames)} frames {w}x{h} at {fps:.2f} fps")
        cost = {}
        rows = None
        for parts in (("body",), ("body", "hands"), ("body", "hands", "face")):
            rows, cost[parts] = run_landmarks(frames, fps, parts)
        with tempfile.TemporaryDirectory() as tmp:
            ref = run_reference(path, Path(tmp) / "ref.npz", "holistic")
        ref_people = int(np.isfinite(ref["pose"][:, 0, 0]).sum())
        ref_ms = 1000 * float(ref["cpu_s"].sum()) / max(ref_people, 1)
        full = cost[("body", "hands", "face")]
        print(
            f"  CPU ms per person-frame: body {cost[('body',)]:.1f}, + hands "
            f"{cost[('body', 'hands')]:.1f}, + face {full:.1f}; mediapipe holistic "
            f"{ref_ms:.1f} ({ref_people} person-frames); ratio {full / ref_ms:.2f}"
        )
        tracked = sum(r is not None for r in rows)
        for block in ("hands", "face"):
            held = np.array(HELD_OUT[block][0])
            truth_frames = sum(
                r is not None and np.isfinite(r[1][held]).all(axis=1).any() for r in rows
            )
            if truth_frames < 2:
                print(
                    f"  held out {block}: found on {truth_frames} of {tracked} tracked frames; "
                    "skipped"
                )
                continue
            for seconds in (1.0, 3.0):
                every = max(1, round(seconds * fps))
                errs = evaluate(rows, frames, fps, every, block)
                print(
                    f"  held out {block} ({truth_frames} frames), keyframe every {seconds:g} s "
                    f"({every} frames):"
                )
                for line in table(errs, seconds):
                    print(line)


if __name__ == "__main__":
    main()
