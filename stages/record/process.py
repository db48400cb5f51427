"""`npucam process SESSION --config CONFIG`'s first cut: the config run over a recording with
nothing dropped. Each camera of the config reads its recorded camera (`recording:SESSION`, not
paced, capture times shifted to the run's start), every inbox blocks and keeps stale items,
every camera's staleness budget is a day, the publish stage binds a free loopback port and a
record stage logs every message it sends into OUT (a session `take` that `npucam replay` reads),
written out as JSON lines (messages.jsonl) at the end; the config's own record stages are
left out. Progress is the recorded frames the
capture stage has read against the recording's total."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import tomllib
from pathlib import Path

from pipeline import wire
from pipeline.config import Config, ConfigError, parse_config
from pipeline.graph import Pipeline, stage_class
from stages.record.frame_log import FRAMES_DIR, INDEX_SUFFIX, read_index
from stages.record.replay import messages
from stages.record.segments import segment_stems

log = logging.getLogger(__name__)

DAY_MS = 86_400_000.0  # the longest time a config accepts (pipeline/config.py sane_number)
TAKE = "take"
RECORDER = "process_record"
PROGRESS_S = 1.0


def recorded_frames(session: Path) -> dict[str, int]:
    """camera -> complete frames recorded in the session."""
    counts = {}
    for folder in sorted((session / FRAMES_DIR).iterdir()):
        if folder.is_dir():
            stems = segment_stems(folder, INDEX_SUFFIX)
            counts[folder.name] = sum(len(read_index(s.with_suffix(INDEX_SUFFIX))) for s in stems)
    return counts


def offline_config(config_path: Path, session: Path, out: Path) -> Config:
    """CONFIG turned into its offline run over SESSION, recording its messages into OUT; a
    ConfigError naming the file for a camera the session did not record or no publish stage."""
    try:
        data = tomllib.loads(config_path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{config_path}: cannot read: {exc}") from None
    recorded = recorded_frames(session)
    for i, camera in enumerate(data.get("cameras", [])):
        name = camera.get("name")
        if name not in recorded:
            raise ConfigError(
                f"{config_path}: cameras[{i}]: the session {session} has no camera {name!r} "
                f"(it has {', '.join(recorded) or 'none'})"
            )
        camera["url"] = f"recording:{session.resolve()}?camera={name}"
        camera.update(realtime=False, loop=False, end="stop", staleness_ms=DAY_MS)
        camera.pop("fps", None)
    # the config's own record stages would record the recording again: the take replaces them
    dropped = {s.get("name", "record") for s in data.get("stages", []) if s.get("kind") == "record"}
    stages = data["stages"] = [s for s in data.get("stages", []) if s.get("kind") != "record"]
    for stage in stages:
        if "to" in stage:
            stage["to"] = [t for t in stage["to"] if t not in dropped]
    publishers = [s for s in stages if s.get("kind") == "publish"]
    if len(publishers) != 1:
        raise ConfigError(f"{config_path}: process needs exactly one publish stage")
    for stage in stages:
        if stage_class(stage["kind"]).accepts:  # sources have no inbox
            inbox = stage.get("inbox", {})
            stage["inbox"] = {"size": inbox.get("size", 8), "policy": "block", "drop_stale": False}
    publish = publishers[0]
    publish.update(bind="tcp://127.0.0.1:*", wait_for_subscribers=0)
    publish["to"] = [*publish.get("to", []), RECORDER]
    stages.append(
        {
            "kind": "record",
            "name": RECORDER,
            "path": str(out.resolve()),
            "session": TAKE,
            "frames": False,
            "messages": publish.get("name", "publish"),
            "inbox": {"size": 8, "policy": "block", "drop_stale": False},
        }
    )
    return parse_config(data, config_path)


async def run_offline(config: Config, total: int, stream=sys.stderr) -> int:
    """Run the offline config, printing progress (frames read, rate, ETA) every PROGRESS_S."""
    pipeline = Pipeline(config)
    stages = zip(config.stage_names, config.stages, strict=True)
    captures = {name for name, stage in stages if stage.kind == "capture"}
    task = asyncio.create_task(pipeline.run())
    start = time.monotonic()
    while not task.done():
        await asyncio.wait({task}, timeout=PROGRESS_S)
        done = sum(n for (stage, _), n in pipeline.metrics.items_out.items() if stage in captures)
        elapsed = time.monotonic() - start
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f"{(total - done) / rate:.0f} s" if rate > 0 else "?"
        print(f"process: {done}/{total} frames, {rate:.1f} frames/s, ETA {eta}", file=stream)
    return task.result()


def write_jsonl(take: Path, path: Path) -> int:
    """Every logged message as one JSON line: topic, header, and its arrays as lists."""
    count = 0
    with open(path, "w") as f:
        for _, parts in messages(take):
            message = wire.decode(parts)
            arrays = {k: v.tolist() for k, v in message.arrays.items()}
            line = {"topic": message.topic, "header": message.header, "arrays": arrays}
            f.write(json.dumps(line) + "\n")
            count += 1
    return count
