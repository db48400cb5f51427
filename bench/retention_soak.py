"""The recording folder under its cap for a long run: `npucam run` of a synthetic camera
(1280x720 at 25 fps: ~2.3 MB/s of JPEG at quality 90) publishing and recording with
`max_bytes` (default 50 MB) for --seconds (default 600), the folder's size (every file under
it) sampled every second from this process. Prints the samples' maximum against the cap, the
bytes written in all (the last sidecar's offsets summed per segment seen), and the segments
deleted; the reference is the cap itself, so the ratio printed is max / cap (<= 1 expected).

    .venv/bin/python bench/retention_soak.py [--seconds 600] [--cap 50000000]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFIG = """
[[cameras]]
name = "card"
url = "synthetic:?width=1280&height=720&fps=25"
[[stages]]
kind = "capture"
to = ["publish", "record"]
[[stages]]
kind = "publish"
bind = "tcp://127.0.0.1:*"
[[stages]]
kind = "record"
path = "{path}"
max_bytes = {cap}
segment_bytes = {segment}
segment_s = 10
"""


def folder_bytes(folder: Path) -> tuple[int, set[Path]]:
    """(bytes of every file under folder, the segment files seen)."""
    total, seen = 0, set()
    for path in folder.rglob("*.*"):
        with contextlib.suppress(FileNotFoundError):  # retention deleted it meanwhile
            total += path.stat().st_size
            seen.add(path)
    return total, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--cap", type=int, default=50_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp) / "rec"
        config = Path(tmp) / "soak.toml"
        config.write_text(CONFIG.format(path=rec, cap=args.cap, segment=args.cap // 8))
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run", str(config), "--duration", str(args.seconds)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        samples, every = [], set()
        while proc.poll() is None:
            size, seen = folder_bytes(rec) if rec.exists() else (0, set())
            samples.append(size)
            every |= seen
            time.sleep(1.0)
        size, seen = folder_bytes(rec)
        samples.append(size)
        every |= seen
        remaining = {p for p in every if p.exists()}
        print(f"exit {proc.returncode}, {len(samples)} samples a second apart, cap {args.cap}")
        print(
            f"max {max(samples)} bytes ({max(samples) / args.cap:.3f} of the cap), final {size}; "
            f"segment files seen {len(every)}, deleted {len(every - remaining)}"
        )
        print(f"frames on disk at the end: {count_frames(rec)}")


def count_frames(rec: Path) -> int:
    return sum(p.read_bytes().count(b"\n") - 1 for p in rec.rglob("frames/*/*.csv"))


if __name__ == "__main__":
    main()
