"""Rig person ids on Pose2Sim's multi-person demo: does every person keep one id over the clip?

Usage: python bench/multi_person_ids.py [--seed blazepose|blazepose-tiles] [--max-people N]
                                        [--every N] [--frames N]
Each of the four 60 fps videos of Demo_MultiPerson goes through its own stages.landmarks
LandmarkTracker (body, up to --max-people people, seeded by the named detector as detect's
`live.seed_detector`; every --every-th frame, timestamps at the videos' 60 fps), placed on the
308 keypoints by to_308; the f-th frames are one instant. Each instant goes through the rig3d
stage's Reconstructor (association, rig person ids, swap_sides, triangulation) with the lab's
imported Qualisys calibration, and stages/rig/id_switches.py counts ID switches as the stage's
gauges do. Prints the people each view followed per instant, each rig id's instants and
where it was, and the switches. tests/stages/rig/test_multi_person_ids.py asserts them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.assets import POSE2SIM_CAMERAS, pose2sim_demo  # noqa: E402
from stages.landmarks.detection import PoseDetector  # noqa: E402
from stages.landmarks.schema import to_308  # noqa: E402
from stages.landmarks.tiles import TiledDetector  # noqa: E402
from stages.landmarks.tracker import LandmarkTracker  # noqa: E402
from stages.rig.id_switches import IdSwitches, person_centre  # noqa: E402
from stages.rig.importers import import_calibration  # noqa: E402
from stages.rig.reconstruct import Reconstructor, View2D  # noqa: E402

FPS = 60.0
DEMO = "Demo_MultiPerson"


@dataclass
class IdRun:
    seed: str
    people_per_view: np.ndarray  # int [V, T]: people each view's tracker followed
    ids: list[tuple[int, ...]]  # per instant
    centres: dict[int, list[tuple[int, np.ndarray]]]  # rig id -> (instant, hip centre m)
    switches: IdSwitches
    detector_passes: int
    seconds: float

    def lines(self) -> list[str]:
        t = self.people_per_view.shape[1]
        out = [
            f"seed detector {self.seed}: {t} instants, {self.detector_passes} detector passes, "
            f"{self.seconds:.0f} s of 2D landmarks"
        ]
        for v, name in enumerate(POSE2SIM_CAMERAS):
            hist = Counter(self.people_per_view[v].tolist())
            out.append(f"{name}: people followed per instant {dict(sorted(hist.items()))}")
        persons = Counter(len(i) for i in self.ids)
        out.append(f"3D people per instant: {dict(sorted(persons.items()))}")
        for rid, seen in sorted(self.centres.items()):
            c = np.stack([x for _, x in seen])
            out.append(
                f"rig id {rid}: {len(seen)} instants ({seen[0][0]}..{seen[-1][0]}), hips at "
                f"{np.round(np.median(c, axis=0), 2).tolist()} m (median)"
            )
        s = self.switches
        out.append(
            f"ID switches: {s.switches} (jumps {s.jumps}, rejoins {s.rejoins}); positions that "
            f"jumped and came back: {s.glitches}; new ids {s.new_ids}"
        )
        return out


def seed_detector(seed: str) -> PoseDetector | TiledDetector:
    if seed == "blazepose":
        return PoseDetector()
    if seed == "blazepose-tiles":
        return TiledDetector(PoseDetector())
    raise ValueError(f"unknown seed detector {seed!r}")


def views_2d(video: Path, seed: str, max_people: int, every: int, frames: int):
    """Per kept frame: (track ids, keypoints float64 [N, 308, 3]); and the detector passes."""
    detector = seed_detector(seed)
    tracker = LandmarkTracker(detector, parts=("body",), max_people=max_people)
    cap = cv2.VideoCapture(str(video))
    if not cap.isOpened():
        raise RuntimeError(f"{video}: cannot open")
    rows, i = [], 0
    while frames <= 0 or i < frames:
        ok, image = cap.read()
        if not ok:
            break
        if i % every == 0:
            people = tracker.step(image, (i + 1) / FPS)
            kps = [np.column_stack(to_308(p.body.xy, p.body.visibility)) for p in people]
            rows.append(
                (
                    tuple(p.track_id for p in people),
                    np.stack(kps) if kps else np.zeros((0, 308, 3)),
                )
            )
        i += 1
    cap.release()
    passes = detector.passes if isinstance(detector, TiledDetector) else tracker.detector_runs
    return rows, passes


def run(
    seed: str = "blazepose-tiles", max_people: int = 2, every: int = 2, frames: int = 0
) -> IdRun:
    calibration = import_calibration(
        "qualisys", [pose2sim_demo(DEMO) / "calibration" / "Calib.qca.txt"]
    )
    cameras = list(calibration.cameras.values())
    t0 = time.perf_counter()
    videos = [pose2sim_demo(DEMO) / "videos" / f"{c}.mp4" for c in POSE2SIM_CAMERAS]
    runs = [views_2d(v, seed, max_people, every, frames) for v in videos]
    seconds = time.perf_counter() - t0
    n = min(len(rows) for rows, _ in runs)
    reconstruct = Reconstructor(cameras, swap_sides=True)
    switches = IdSwitches()
    ids: list[tuple[int, ...]] = []
    centres: dict[int, list[tuple[int, np.ndarray]]] = {}
    for f in range(n):
        views = {
            cam.name: View2D(*runs[v][0][f]) for v, cam in enumerate(cameras) if runs[v][0][f][0]
        }
        t_s = (f * every + 1) / FPS
        people = reconstruct(t_s, views, 308)
        switches.update(t_s, people.ids, people.points)
        ids.append(people.ids)
        for p, rid in enumerate(people.ids):
            c = person_centre(people.points[p])
            if c is not None:
                centres.setdefault(rid, []).append((f, c))
    per_view = np.array([[len(runs[v][0][f][0]) for f in range(n)] for v in range(len(runs))])
    return IdRun(seed, per_view, ids, centres, switches, sum(p for _, p in runs), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seed", default="blazepose-tiles", choices=["blazepose", "blazepose-tiles"]
    )
    parser.add_argument("--max-people", type=int, default=2)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--frames", type=int, default=0)
    args = parser.parse_args()
    for line in run(args.seed, args.max_people, args.every, args.frames).lines():
        print(line)


if __name__ == "__main__":
    main()
