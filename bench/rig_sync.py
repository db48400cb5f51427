"""A rig of files with and without capture's `synchronized` in one invocation: the config as
shipped (one SharedTimeline, stages/sources.py) and the same with every camera pacing itself
from its own open, each run for --seconds with bench/rig_rate.py's subscriber. Prints per run
the rig's groups with every view, their mean skew, the pose3d messages with a person, and
the groups whose views are one frame of the recording (the same det/ seq on every camera).

Usage: .venv/bin/python bench/rig_sync.py [--config configs/studio-3d.toml] [--seconds 40]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from rig_rate import measure  # noqa: E402

SYNC_LINE = "synchronized = true"


def run(config: Path, synchronized: bool, seconds: float, warmup: float, tmp: Path) -> dict:
    text = config.read_text()
    if SYNC_LINE not in text:
        raise SystemExit(f"{config}: its capture stage is not `{SYNC_LINE}`")
    if not synchronized:
        text = text.replace(SYNC_LINE, "synchronized = false")
    variant = tmp / ("sync" if synchronized else "own")
    variant.mkdir()
    path = variant / config.name
    path.write_text(text)
    # relative paths in the config resolve against configs/, as rig_rate rewrites them
    return measure(path, seconds, warmup, variant)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/studio-3d.toml")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    args = parser.parse_args()
    config = (REPO / args.config).resolve()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for synchronized in (True, False):
            rows[synchronized] = run(config, synchronized, args.seconds, args.warmup, Path(tmp))
    for synchronized, got in rows.items():
        g = got["gauges"]
        groups = g.get("groups", 0) or 1
        print(
            f"{'synchronized' if synchronized else 'own schedules'}: groups "
            f"{g.get('groups', 0):.0f}, with every view {g.get('complete_groups', 0):.0f} "
            f"({g.get('complete_groups', 0) / groups:.0%}), skew mean "
            f"{g.get('skew_mean_ms', 0):.1f} ms max {g.get('skew_max_ms', 0):.1f} ms, late frames "
            f"{g.get('late_frames', 0):.0f}; pose3d with a person {got['messages']} over "
            f"{got['span_s']:.1f} s; one recording frame per group "
            f"{got['same_seq_groups']} of {got['seq_groups']}"
        )
    a, b = rows[True]["gauges"], rows[False]["gauges"]
    if a.get("groups") and b.get("groups"):
        ratio = (a["complete_groups"] / a["groups"]) / max(b["complete_groups"] / b["groups"], 1e-9)
        print(f"complete-group fraction, synchronized / own schedules: {ratio:.2f}")


if __name__ == "__main__":
    main()
