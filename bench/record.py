"""The record stage's cost per 1080p frame: npucam's frame log (stages/record/frame_log.py: a
JPEG from cv2.imencode appended to the segment's MJPEG stream, its sidecar line after it)
against OpenCV's own MJPEG-in-AVI writer (cv2.VideoWriter, fourcc MJPG, the same quality) on
the same frames, and the frame log with one face blurred first (blur_faces,
stages/record/privacy.py), in the same process, taking turns (ours, blurred, reference, ours,
...) so a drift of the shared host's speed falls on all. CPU time of this process (thread CPU
would miss libjpeg's threads, if any) and wall time per frame, median over the rounds, the
PSNR each keeps (first round), and the ratios ours / reference and blurred / ours. The image
is bikes.mp4's first frame resized to 1920x1080 plus Gaussian noise (sigma 3), as
bench/frame_transport.py's, so JPEG has natural-ish detail to code.

    .venv/bin/python bench/record.py [--frames 60] [--rounds 5] [--quality 90] [--size 1920x1080]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.frame_transport import test_image  # noqa: E402
from stages.record.frame_log import FrameSegmentWriter, encode_jpeg, read_frames  # noqa: E402
from stages.record.privacy import blur_boxes  # noqa: E402


def ours(frames: list[np.ndarray], folder: Path, quality: int) -> int:
    writer = FrameSegmentWriter(folder / "000001")
    for seq, frame in enumerate(frames):
        writer.append(seq, seq, encode_jpeg(frame, quality))
    writer.close()
    return writer.bytes


# one face box in the middle of a 1080p frame, about a face at 2-3 m on a 90-degree lens
FACE = np.array([[810.0, 360.0, 1110.0, 720.0]], np.float32)


def ours_blurred(
    frames: list[np.ndarray], folder: Path, quality: int, face: np.ndarray = FACE
) -> int:
    """ours, with one face (float32 [1, 4] xyxy px) blurred first (the record stage's
    blur_faces)."""
    writer = FrameSegmentWriter(folder / "000001")
    for seq, frame in enumerate(frames):
        writer.append(seq, seq, encode_jpeg(blur_boxes(frame, face, 0.2), quality))
    writer.close()
    return writer.bytes


def reference(frames: list[np.ndarray], folder: Path, quality: int) -> int:
    path = folder / "ref.avi"
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (w, h))
    writer.set(cv2.VIDEOWRITER_PROP_QUALITY, quality)
    if not writer.isOpened():
        raise SystemExit("OpenCV cannot write MJPG .avi here")
    for frame in frames:
        writer.write(frame)
    writer.release()
    return path.stat().st_size


def psnr_of(folder: Path, frames: list[np.ndarray]) -> float:
    """Mean PSNR (dB) of what was written against the frames: ours through read_frames and
    cv2.imdecode, the reference through cv2.VideoCapture."""
    if (folder / "ref.avi").exists():
        cap = cv2.VideoCapture(str(folder / "ref.avi"))
        decoded = [cap.read()[1] for _ in frames]
        cap.release()
    else:
        decoded = [
            cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            for _, jpeg in read_frames(folder / "000001.csv")
        ]
    return statistics.mean(cv2.PSNR(a, b) for a, b in zip(decoded, frames, strict=True))


def timed(fn, frames, quality, psnr: bool = False) -> tuple[float, float, int, float]:
    """(CPU ms, wall ms) per frame, the bytes written and (psnr) their PSNR, in a fresh
    folder."""
    with tempfile.TemporaryDirectory() as tmp:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        size = fn(frames, Path(tmp), quality)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        quality_db = psnr_of(Path(tmp), frames) if psnr else float("nan")
    return 1e3 * cpu / len(frames), 1e3 * wall / len(frames), size, quality_db


LABELS = {
    "ours": "npucam frame log",
    "ours_blurred": "npucam frame log, one face blurred",
    "reference": "cv2.VideoWriter MJPG .avi",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument(
        "--size", default="1920x1080", help="WxH; the face box scales with the width (a face at "
        "the same distance on a lower-resolution camera: 640x480's is 100x120)",
    )  # fmt: skip
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    base = test_image(width, height)
    face = FACE * (width / 1920)
    blurred = functools.partial(ours_blurred, face=face)
    # frames that differ (a shifted copy each), so no encoder sees one image again
    frames = [np.roll(base, 8 * i, axis=1) for i in range(args.frames)]
    results: dict[str, list] = {"ours": [], "ours_blurred": [], "reference": []}
    timed(ours, frames[:5], args.quality)  # warm-up: libjpeg's tables, the page cache
    timed(reference, frames[:5], args.quality)
    for i in range(args.rounds):
        results["ours"].append(timed(ours, frames, args.quality, psnr=i == 0))
        results["ours_blurred"].append(timed(blurred, frames, args.quality))
        results["reference"].append(timed(reference, frames, args.quality, psnr=i == 0))
    print(
        f"{width}x{height}, JPEG quality {args.quality}, {args.frames} frames x {args.rounds} "
        f"rounds; the face {face[0, 2] - face[0, 0]:.0f}x{face[0, 3] - face[0, 1]:.0f}"
    )
    print("| writer | CPU ms / frame | wall ms / frame | KB / frame | PSNR dB |")
    print("|---|---|---|---|---|")
    med = {}
    for name, rows in results.items():
        cpu = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        kb = rows[0][2] / args.frames / 1024
        med[name] = cpu
        label = LABELS[name]
        psnr = "-" if np.isnan(rows[0][3]) else f"{rows[0][3]:.1f}"
        print(f"| {label} | {cpu:.2f} | {wall:.2f} | {kb:.0f} | {psnr} |")
    ratios = [o[0] / r[0] for o, r in zip(results["ours"], results["reference"], strict=True)]
    print(
        f"CPU ratio ours / reference: median {statistics.median(ratios):.2f} "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )
    blur = [b[0] / o[0] for b, o in zip(results["ours_blurred"], results["ours"], strict=True)]
    print(f"CPU ratio with one face blurred / without: median {statistics.median(blur):.2f}")


if __name__ == "__main__":
    main()
