"""`npucam process SESSION --config CONFIG --out OUT`: the full-fidelity pass (docs/recording.md).
The config runs over the recording with nothing dropped: each camera reads its recorded camera
(`recording:SESSION`, not paced: the capture stage reads a frame when the pipeline takes it, the
inboxes `block`, so the device's pace sets the pass's), staleness a day, and the detect stage
poses every tracked person on every frame (`pose_every_frame`, a rig's every group and person).
A `take` stage (take.py) writes what publish sends into OUT, frame by frame, with a checkpoint;
run again with the same command, the pass resumes after the last frame the take holds
(detect's `jobs_after`: the frames before are tracked, not posed again). Progress and the ETA
(eta.py, from the planner's device costs) go to stderr; OUT/summary.json has the counts."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from pipeline.clock import SYSTEM, Clock
from pipeline.config import Config, ConfigError, parse_config
from pipeline.graph import Pipeline, stage_class
from stages.record import eta
from stages.record.take import Checkpoint, Take, TakeError, recorded_frames
from stages.rig.stage import Rig3D

DAY_MS = 86_400_000.0  # the longest time a config accepts (pipeline/config.py sane_number)
TAKER = "process_take"
SUMMARY = "summary.json"
PASS = "pass.json"  # the session and config text the take is of
PROGRESS_S = 1.0
# what the pass runs (detection, the per-frame path, Sapiens2, 3D, body): the models of other
# targets are off in it, and the stages whose output would leave the take are left out
OFF_MODELS = ("adaface", "clip")
LEFT_OUT = ("record",)
MAX_RIG_PEOPLE = 64  # rig3d's max_people bound (stages/rig/stage.py)
# a rig's groups published, those published before every pose came, and poses that came after
# their group left: the last two are 3D the pass lost, as a drop is
RIG_COUNTS = ("published", "timed_out", "late_poses")


def offline_config(
    config_path: Path, session: Path, out: Path, jobs_after: dict[str, int] | None = None
) -> Config:
    """CONFIG turned into the pass over SESSION writing its take into OUT (resuming after
    `jobs_after`: camera -> last seq written); a ConfigError naming the file for a camera the
    session did not record, or not exactly one publish stage."""
    try:
        data = tomllib.loads(config_path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{config_path}: cannot read: {exc}") from None
    order, _ = recorded_frames(session)
    rates = {c.get("name"): c["fps"] for c in data.get("cameras", []) if "fps" in c}
    for i, camera in enumerate(data.get("cameras", [])):
        name = camera.get("name")
        if name not in order:
            raise ConfigError(
                f"{config_path}: cameras[{i}]: the session {session} has no camera {name!r} "
                f"(it has {', '.join(order) or 'none'})"
            )
        camera["url"] = f"recording:{session.resolve()}?camera={name}"
        camera.update(realtime=False, loop=False, end="stop", staleness_ms=DAY_MS)
        camera.pop("fps", None)
    dropped = {s.get("name", s["kind"]) for s in data.get("stages", []) if s["kind"] in LEFT_OUT}
    stages = data["stages"] = [s for s in data.get("stages", []) if s["kind"] not in LEFT_OUT]
    publishers = [s for s in stages if s["kind"] == "publish"]
    if len(publishers) != 1:
        raise ConfigError(f"{config_path}: process needs exactly one publish stage")
    _unsynchronized(stages)
    rigs: dict[str, list[str]] = {}
    bodies: list[str] = []
    exports = dict.fromkeys(("mot", "bvh"))  # the body files besides the .trc, in order
    poses = False
    for stage in stages:
        if "to" in stage:
            stage["to"] = [t for t in stage["to"] if t not in dropped]
        if stage_class(stage["kind"]).accepts:  # sources have no inbox
            size = stage.get("inbox", {}).get("size", 8)
            stage["inbox"] = {"size": size, "policy": "block", "drop_stale": False}
        kind = stage["kind"]
        if kind == "detect":
            poses = poses or stage.get("pose", True)
            # one worker: a second one's lane keeps only a camera's newest frame
            stage.update(
                pose_every_frame=True, workers=1, faces=False, clip="off",
                jobs_after=dict(jobs_after or {}),
            )  # fmt: skip
        elif kind == "infer":
            for model in OFF_MODELS:
                if isinstance(stage.get(model), dict):
                    stage[model]["enabled"] = False
        elif kind == "rig3d":
            # groups close when every camera has gone past them (the recording is read in
            # capture-time order) and leave once their poses came, never by the wall clock,
            # which says nothing offline (a pass behind real time would otherwise publish a
            # group with the views placed so far); the tolerance stays what the cameras'
            # live rates made it (their fps is dropped)
            fps = [rates.get(c, stage.get("fps", 30.0)) for c in stage["cameras"]]
            stage.setdefault("tolerance_ms", 500.0 / max(fps))
            stage.update(
                pose_interval_ms=0.0, max_people=MAX_RIG_PEOPLE, sync_wait_ms=DAY_MS,
                wait_ms=DAY_MS / 2,  # below the cameras' staleness, as rig3d checks
            )  # fmt: skip
            stage.pop("trc", None)  # the take writes its own
            rigs[stage["rig"]] = list(stage["cameras"])
        elif kind == "body":
            if _body_files_to_take(stage):
                exports["gltf"] = None
            bodies.append(stage["rig"])
    publish = publishers[0]
    publish.update(bind="tcp://127.0.0.1:*", wait_for_subscribers=0, preview=False)
    publish["to"] = [*publish.get("to", []), TAKER]
    stages.append(
        {
            "kind": f"{Take.__module__}:{Take.__name__}",
            "name": TAKER,
            "out": str(out.resolve()),
            "session": str(session.resolve()),
            "publish": publish.get("name", "publish"),
            "poses": poses,
            "rigs": rigs,
            "bodies": bodies,
            "exports": list(exports),
            "inbox": {"size": 1, "policy": "block", "drop_stale": False},
        }
    )
    return parse_config(data, config_path)


def _unsynchronized(stages: list[dict]) -> None:
    """Capture stages lose `synchronized`: the recording's capture times already put its
    cameras on one timeline, and the pass reads them as fast as it goes, which a shared
    timeline refuses (it needs paced cameras)."""
    for stage in stages:
        if stage["kind"] == "capture":
            stage.pop("synchronized", None)


def _body_files_to_take(stage: dict) -> bool:
    """A body stage's files are the take's (written from its body lines, so a resumed pass's
    are whole) and its live link is off (no one watches a pass at the device's pace): the
    keys go; whether it asked for glTF."""
    for key in ("trc", "mot", "bvh", "vmc", "vmc_person"):
        stage.pop(key, None)
    return stage.pop("gltf", None) is not None


def pass_cost(config: Config) -> eta.PassCost:
    """The planner's device seconds of one Sapiens2 pose in this config (stages/planning/npu.py:
    the calibrated NPU2 time when paced as NPU2, else the modelled or measured one)."""
    from stages.infer_options import InferOptions
    from stages.planning.npu import device_costs

    for stage in config.stages:
        if stage.kind == "infer":
            options = InferOptions.model_validate(stage.options)
            if "sapiens2" in options.enabled():
                costs = device_costs(config, options, {}, {}, measure=False)
                return eta.PassCost(pose_s=costs["sapiens2"].item_s)
    return eta.PassCost(pose_s=0.0, frame_s=0.0)


class Progress:
    """The pass's progress on stderr (a tqdm bar) with eta.estimate's ETA; `history` keeps
    (elapsed s, frames done, ETA s or None) at every update, for bench/process_eta.py."""

    def __init__(
        self,
        cost: eta.PassCost,
        total: int,
        done: int,
        stream: TextIO = sys.stderr,
        clock: Clock = SYSTEM,
    ) -> None:
        self.cost, self.total, self.start_done = cost, total, done
        self.clock = clock
        self.start = clock.monotonic()
        self.base: tuple[float, int, int] | None = None  # (time, frames, poses) of the first
        self.history: list[tuple[float, int, float | None]] = []
        self.bar = tqdm(
            total=total, initial=done, file=stream, unit="frame", desc="process",
            mininterval=0, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} frames "
            "[{elapsed}{postfix}]",
        )  # fmt: skip

    def update(self, frames: int, poses: int) -> eta.Estimate | None:
        now = self.clock.monotonic()
        if self.base is None and frames > self.start_done:
            self.base = (now, frames, poses)
        estimate = None
        if self.base is not None:
            t0, f0, p0 = self.base
            estimate = eta.estimate(
                self.cost, self.total - frames, frames - f0, poses - p0, now - t0
            )
        remaining = None if estimate is None else estimate.remaining_s
        self.history.append((now - self.start, frames, remaining))
        shown = "?" if remaining is None else f"{remaining:.0f} s"
        self.bar.set_postfix_str(f"ETA {shown}, {poses} poses", refresh=False)
        self.bar.update(frames - self.bar.n)
        return estimate

    def close(self) -> None:
        self.bar.close()


async def run_offline(
    config: Config, stream: TextIO = sys.stderr, clock: Clock = SYSTEM
) -> tuple[int, dict[str, Any], Progress]:
    """Run the pass: (exit code, the summary written to OUT/summary.json, its Progress). The
    exit code is 1 when a stage died, a frame or job was dropped, a rig group left without
    every pose, or the pass was stopped before its end."""
    pipeline = Pipeline(config)
    captures = {
        n for n, s in zip(config.stage_names, config.stages, strict=True) if s.kind == "capture"
    }
    task = asyncio.create_task(pipeline.run())
    started = time.monotonic()
    progress: Progress | None = None
    while not task.done():
        await asyncio.wait({task}, timeout=PROGRESS_S)
        take = pipeline.stages.get(TAKER)
        if not isinstance(take, Take):
            continue
        writer = take.writer
        if progress is None:
            progress = Progress(
                pass_cost(config), writer.total_frames, writer.frames_written, stream, clock
            )
        progress.update(writer.frames_written, writer.poses_written)
    code = task.result()
    take = pipeline.stages[TAKER]
    assert isinstance(take, Take)
    writer = take.writer
    if progress is None:
        progress = Progress(pass_cost(config), writer.total_frames, 0, stream, clock)
    progress.update(writer.frames_written, writer.poses_written)
    progress.close()
    drops = {
        f"{stage}/{camera}/{reason}": n
        for (stage, camera, reason), n in sorted(pipeline.metrics.drops.items())
        if n
    }
    rigs = {
        stage.options.rig: {k: stage.counts[k] for k in RIG_COUNTS}
        for stage in pipeline.stages.values()
        if isinstance(stage, Rig3D)
    }
    summary = {
        "frames_recorded": writer.total_frames,
        "frames_read": sum(
            n for (stage, _), n in pipeline.metrics.items_out.items() if stage in captures
        ),
        "frames_written": writer.frames_written,
        "persons_posed": writer.poses_written,
        "drops": sum(drops.values()),
        "drops_by_stage": drops,
        "rigs": rigs,
        # every frame written by the writer's finish: a signal's drain can end the pass after
        # every det came but before the poses did, or cancel the take before it finished
        "complete": writer.finished and writer.frames_written == writer.total_frames,
        "seconds": round(time.monotonic() - started, 3),
    }
    Path(take.options.out, SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    if lost(summary) or not summary["complete"]:
        code = code or 1
    return code, summary, progress


def lost(summary: dict[str, Any]) -> int:
    """What a pass's summary says it lost: drops, rig groups published without every pose,
    and poses that came after their group left."""
    rigs = summary.get("rigs", {}).values()
    return summary["drops"] + sum(r["timed_out"] + r["late_poses"] for r in rigs)


def resume_point(out: Path, session: Path, config_path: Path) -> dict[str, int]:
    """camera -> the last seq the take in OUT holds (empty for a new take, which is marked
    as this session's pass with this config); a TakeError naming OUT when it holds another
    pass's take."""
    this = {"session": str(session.resolve()), "config": config_path.read_text()}
    path = out / PASS
    if path.exists():
        if json.loads(path.read_text()) != this:
            raise TakeError(
                f"{out}: holds the take of another session or config ({path}): "
                "give another --out, or delete it to start over"
            )
    else:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(this))
    return Checkpoint.read(out).cameras


def finished_summary(out: Path) -> dict[str, Any] | None:
    """The summary of a pass that ran to its end in OUT, None if none did."""
    path = out / SUMMARY
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("complete") else None
