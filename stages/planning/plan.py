"""`npucam plan CONFIG` as data: the config's cameras probed, its CPU side measured on this
machine (stages.planning.probe), its NPU side modelled (stages.planning.npu), and per
resource what is asked, what will run, what drops and why, and the rates each camera can
sustain (docs/operations.md, "Sizing a deployment").

The CPU model: the capture threads decode every frame a camera delivers; the detect stage
is one worker thread, so it processes at most 1 / (its seconds per frame) frames a second,
shared max-min fairly between its cameras (its `latest` inbox drops the oldest frame of the
busiest camera), and slowed when this process's other threads (decoding, the simulator's
stand-in forwards) leave it less than a core; the frames it cannot take are dropped
`queue_full` at its inbox. The NPU side then runs on the frames detect processes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.config import Config, load_config
from pipeline.graph import stage_class
from stages.detect_workers import default_workers, lane_of
from stages.planning.body import body_loads
from stages.planning.npu import (
    CameraLoad,
    ModelCost,
    NpuOutcome,
    PlanError,
    context_budget,
    device_costs,
    simulate_npu,
)
from stages.planning.probe import CameraProbe, Scene, measure_scenes, probe_cameras
from stages.planning.rig_rate import RigRate, live_rig_rates

DEFAULT_PEOPLE = 2.0  # people per frame of a camera whose frames cannot be read
# make_plan's defaults, which `npucam plan` shows and passes (stages/commands/plan.py)
DEFAULT_FPS = 10.0  # a camera's rate when it is neither probed nor configured
DEFAULT_FRAMES = 250  # frames sampled per camera: the whole of each sample clip
DEFAULT_PROBE_S = 10.0  # seconds a live camera is read for its rate and scene
DEFAULT_HORIZON_S = 150.0  # simulated seconds of the scheduler run (the first 30 warm up)
SATURATED = 0.97  # predicted NPU busy fraction from which it counts as at capacity


@dataclass
class CameraPlan:
    """One camera's part of a plan. fps: what it delivers; detect_fps: the frames detect
    keeps up with (sustainable); results: model -> results/s of this camera;
    pose_every_s: seconds between two poses of one of its people (None: no pose)."""

    camera: str
    kind: str
    fps: float
    fps_source: str
    size: tuple[int, int] | None
    decode_ms: float
    detect_ms: float | None
    people: float
    faces: float
    scene: str
    detect_fps: float
    detect_drop: float
    results: dict[str, float] = field(default_factory=dict)
    pose_every_s: float | None = None
    note: str = ""
    loop_s: float = 0.0  # seconds before its planned scene repeats (0: no scene)
    # detect's per-frame pose: ms of the landmark models a person-frame, people followed a
    # frame (None, 0: not on)
    live_ms_per_person: float | None = None
    live_people: float = 0.0


@dataclass
class Plan:
    """A plan (see the module docstring). utilisation: per resource, what is asked of it
    (npu: device-s/s of the jobs detect would issue; cpu: cores; detect: its one thread)
    and what is predicted to run; drops: detect's queue_full fraction and rate, and per model
    its npu_busy / stale / queue_full jobs a second."""

    config: str
    backend: str
    pacing: str
    cores: int
    load_avg: float
    costs: dict[str, ModelCost]
    budget: dict[str, Any]
    cameras: list[CameraPlan]
    utilisation: dict[str, dict[str, float]]
    bottleneck: str
    drops: dict[str, dict[str, float]]
    results: dict[str, float]
    notes: list[str]
    planned_s: float = 0.0
    passes: dict[str, float] = field(default_factory=dict)  # model -> device passes/s
    # model -> (lowest, highest) results/s over any 45 s: what one minute's run may show
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)
    # model -> its share of the context budget after the scheduler's run (stages.scheduler
    # ContextShare: resident, loads, whose loads evicted its contexts)
    contexts: dict[str, Any] = field(default_factory=dict)
    # simulated seconds the NPU figures are over: whole loops of the longest scene
    window_s: float = 0.0
    # each live rig's predicted pose3d rate (stages.planning.rig_rate)
    rigs: list[RigRate] = field(default_factory=list)

    @property
    def npu_utilisation(self) -> float:
        return self.utilisation.get("npu", {}).get("predicted", 0.0)

    @property
    def detect_drop(self) -> float:
        return self.drops.get("detect", {}).get("fraction", 0.0)


def _stage_indices(config: Any, kind: str) -> list[int]:
    """The indices of the config's stages of this kind, in order."""
    found = []
    for i, stage in enumerate(config.stages):
        try:
            cls = stage_class(stage.kind)
        except LookupError:
            continue  # `npucam validate` names it
        if getattr(cls, "kind", None) == kind:
            found.append(i)
    return found


def _stage_index(config: Any, kind: str) -> int | None:
    return next(iter(_stage_indices(config, kind)), None)


def _infer_options(config: Any, index: int) -> Any:
    from stages.infer import InferOptions

    try:
        return InferOptions.model_validate(config.stages[index].options)
    except Exception as exc:
        raise PlanError(f"{config.path}: stages[{index}]: invalid infer options: {exc}") from None


def water_fill(offered: dict[str, float], cost_s: dict[str, float], capacity: float) -> dict:
    """Frames a second per camera one thread of `capacity` (fraction of a core) processes:
    max-min fair in frames, each camera at most what it offers, sum(rate x cost) <= capacity."""
    if sum(offered[c] * cost_s[c] for c in offered) <= capacity:
        return dict(offered)
    lo, hi = 0.0, max(offered.values())
    for _ in range(60):
        x = (lo + hi) / 2
        if sum(min(offered[c], x) * cost_s[c] for c in offered) > capacity:
            hi = x
        else:
            lo = x
    return {c: min(offered[c], lo) for c in offered}


def make_plan(  # noqa: C901
    path: str,
    *,
    people: float | None = None,
    faces: float | None = None,
    fps: float = DEFAULT_FPS,
    overrides: dict[str, float] | None = None,
    variants: dict[str, str] | None = None,
    frames: int = DEFAULT_FRAMES,
    probe_timeout_s: float = DEFAULT_PROBE_S,
    horizon_s: float = DEFAULT_HORIZON_S,
    measure: bool = True,
) -> Plan:
    """The plan of the config at `path` (see the module docstring). people / faces: per
    frame of every camera instead of the measured scene; fps: for cameras whose rate is
    neither probed nor configured; overrides: model -> pass seconds; variants: model -> the
    released variant to price it as; frames: frames sampled per camera; measure: also time
    the simulator's stand-in forwards (sim) and the detect stage (else: 0 s a frame)."""
    t0 = time.perf_counter()
    config = load_config(path)
    if not config.cameras:
        raise PlanError(f"{config.path}: no [[cameras]] to plan for")
    overrides, variants = dict(overrides or {}), dict(variants or {})
    notes: list[str] = []
    probes = probe_cameras(config, fps, frames, probe_timeout_s)
    for p in probes:
        if p.note:
            notes.append(f"camera {p.name}: {p.note}")
    by_name = {p.name: p for p in probes}

    det_i, inf_i = _stage_index(config, "detect"), _stage_index(config, "infer")
    detect_opts = None
    scenes: dict[str, Scene] = {}
    if det_i is not None:
        from stages.detect import DetectOptions

        detect_opts = DetectOptions.model_validate(config.stages[det_i].options)
        if measure:
            scenes = measure_scenes(config, det_i, probes, frames)
        else:
            wanted = detect_opts.cameras
            scenes = {
                p.name: Scene([], 0.0, "not measured")
                for p in probes
                if wanted is None or p.name in wanted
            }
        for name, sc in list(scenes.items()):
            scenes[name] = _override(sc, people, faces, detect_opts, by_name[name])

    costs: dict[str, ModelCost] = {}
    infer_opts = None
    pacing = ""
    if inf_i is not None:
        infer_opts = _infer_options(config, inf_i)
        if not infer_opts.enabled():
            raise PlanError(f"{config.path}: the infer stage enables no model")
        for name in {**overrides, **variants}:
            if name not in infer_opts.enabled():
                raise PlanError(
                    f"--cost/--as {name}: not an enabled model "
                    f"(enabled: {', '.join(infer_opts.enabled())})"
                )
        pacing = infer_opts.sim.pacing if infer_opts.backend == "sim" else ""
        costs = device_costs(config, infer_opts, overrides, variants, measure)
    else:
        notes.append("no infer stage in this config: the NPU is not used here")

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    offered = {p.name: p.fps for p in probes}
    capture_cpu = sum(p.fps * p.decode_s for p in probes)
    push_cpu = _push_cpu(config, probes)
    det_cost = {n: sc.detect_s for n, sc in scenes.items()}
    det_offered = {n: offered[n] for n in scenes}
    infer_host = 0.0
    outcome: NpuOutcome | None = None
    rates = dict(det_offered)
    workers = (detect_opts.workers if detect_opts else None) or default_workers(cores)
    pinned = lane_of(list(scenes), workers)
    for _ in range(3):
        others = capture_cpu + push_cpu + infer_host
        # each worker is one thread (at most a core); the cameras pinned to it share it
        per_worker = min(1.0, max(0.05, (cores - others) / workers))
        capacity = per_worker * min(workers, max(len(scenes), 1))
        new = {}
        for k in set(pinned.values()):
            mine = [c for c in scenes if pinned[c] == k]
            new.update(
                water_fill(
                    {c: det_offered[c] for c in mine}, {c: det_cost[c] for c in mine}, per_worker
                )
            )
        if outcome is not None and all(abs(new[c] - rates[c]) <= 0.02 * rates[c] for c in new):
            break
        rates = new
        if infer_opts is not None and costs:
            loads = [
                CameraLoad(n, rates[n], by_name[n].fps, by_name[n].staleness_s, scenes[n].frames)
                for n in scenes
            ]
            outcome = simulate_npu(
                costs, loads, detect_opts, infer_opts,
                face_points=_dark_face_points(config), horizon_s=horizon_s,
                infer_blocks=_inbox_blocks(config, inf_i), rigs=_rigs(config),
            )  # fmt: skip
            infer_host = sum(outcome.passes.get(m, 0.0) * c.host_s for m, c in costs.items())
        else:
            break

    det_asked = sum(det_offered[c] * det_cost[c] for c in scenes)
    det_run = sum(rates[c] * det_cost[c] for c in scenes)
    bodies = body_loads(
        config,
        {p.name: rates.get(p.name, p.fps) for p in probes},
        {p.name: scenes[p.name].mean_people if p.name in scenes else 0.0 for p in probes},
    )
    for b in bodies:
        notes.append(
            f"body {b.stage}: rig {b.rig}, {b.groups_per_s:.1f} groups/s x {b.people:.1f} "
            f"people x {1e3 * b.asked / max(b.groups_per_s * b.people, 1e-12):.2f} ms a "
            f"person-frame (bench/body_fit.py) = "
            f"{b.asked:.2f} cores on its one thread"
        )
    body_asked = sum(b.asked for b in bodies)
    body_run = sum(b.predicted for b in bodies)
    util: dict[str, dict[str, float]] = {
        "cpu": {
            "cores": cores,
            # detect's workers are threads: each can ask at most one core
            "asked": (capture_cpu + push_cpu + min(det_asked, workers) + infer_host + body_run)
            / cores,
            "predicted": min(
                1.0, (capture_cpu + push_cpu + det_run + infer_host + body_run) / cores
            ),
            "capture": capture_cpu,
            "push": push_cpu,
            "detect": det_run,
            "infer_host": infer_host,
            "body": body_run,
            "body_asked": body_asked,
        },
    }
    if scenes:
        util["detect"] = {
            "asked": det_asked,
            "predicted": det_run,
            "capacity": capacity,
            "workers": workers,
        }
    if outcome is not None:
        # superseded jobs (queue_full) are the same work as the job that replaced them
        asked = {
            m: max(0.0, outcome.jobs.get(m, 0.0) - outcome.drops.get(m, {}).get("queue_full", 0.0))
            * c.item_s
            for m, c in costs.items()
        }
        util["npu"] = {"asked": sum(asked.values()), "predicted": outcome.busy, **asked}
    drops: dict[str, dict[str, float]] = {}
    total_off = sum(det_offered.values())
    if scenes:
        lost = total_off - sum(rates.values())
        drops["detect"] = {
            "fraction": lost / total_off if total_off else 0.0,
            "queue_full_per_s": lost,
        }
    if outcome is not None:
        for m, by_reason in outcome.drops.items():
            drops[m] = dict(by_reason)
    results = {m: outcome.results_per_s(m) for m in costs} if outcome is not None else {}
    cam_plans = []
    for p in probes:
        sc = scenes.get(p.name)
        r = rates.get(p.name, p.fps)
        per_model = {}
        if outcome is not None:
            per_model = {m: outcome.results.get(m, {}).get(p.name, 0.0) for m in costs}
        pose_m = next((m for m in costs if _kind(m) == "pose"), None)
        every = None
        if sc is not None and pose_m is not None and sc.mean_people > 0:
            got = per_model.get(pose_m, 0.0)
            every = sc.mean_people / got if got > 0 else float("inf")
        cam_plans.append(
            CameraPlan(
                p.name, p.kind, p.fps, p.fps_source, p.size, p.decode_s * 1e3,
                None if sc is None else sc.detect_s * 1e3,
                0.0 if sc is None else sc.mean_people, 0.0 if sc is None else sc.mean_faces,
                "" if sc is None else sc.source, r, 1 - r / p.fps if sc is not None else 0.0,
                per_model, every, p.note,
                len(sc.frames) / p.fps if sc is not None and sc.frames and p.fps > 0 else 0.0,
                None if sc is None or sc.live_person_s is None else sc.live_person_s * 1e3,
                0.0 if sc is None else sc.live_people,
            )
        )  # fmt: skip
    budget = context_budget(costs, infer_opts.context_slots or 16) if infer_opts else {}
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return Plan(
        str(config.path), infer_opts.backend if infer_opts else "", pacing, cores, load_avg,
        costs, budget, cam_plans, util, _bottleneck(util, costs, config, det_i), drops, results,
        notes, time.perf_counter() - t0, dict(outcome.passes) if outcome is not None else {},
        dict(outcome.spread) if outcome is not None else {},
        dict(outcome.contexts) if outcome is not None else {},
        outcome.window_s if outcome is not None else 0.0,
        live_rig_rates(config, offered, rates if scenes else {}),
    )  # fmt: skip


def _kind(model: str) -> str:
    from npu import models

    return models.spec(model).kind


def _override(
    sc: Scene, people: float | None, faces: float | None, opts: Any, probe: CameraProbe
) -> Scene:
    """The scene with --people / --faces as still boxes (people default DEFAULT_PEOPLE for
    a camera whose frames were not read or measured; faces default one per person when the
    detect stage looks for faces): a person box per id, its face inside it."""
    if people is None and (not probe.frames or not sc.frames):
        people = DEFAULT_PEOPLE
    if people is None and faces is None:
        return sc
    n = max(len(sc.frames), 100) if people is None else 100
    counts = _counts(people, n) if people is not None else None
    face_counts = _counts(faces, n) if faces is not None else None
    frames = []
    for i in range(n):
        if counts is None:
            boxes, scores, found = sc.frames[i % len(sc.frames)]
        else:
            boxes = np.array([[120.0 * j, 0.0, 120.0 * j + 100, 200] for j in range(counts[i])])
            boxes = boxes.astype(np.float32).reshape(-1, 4)
            scores = np.full(len(boxes), 0.9, np.float32)
            found = boxes[:, :0]
        if face_counts is not None:
            k = face_counts[i]
            found = np.array([[120.0 * j + 30, 10, 120.0 * j + 70, 50] for j in range(k)])
        elif counts is not None and opts.face != "none":
            found = np.array([[b[0] + 30, 10, b[0] + 70, 50] for b in boxes])
        else:
            found = found if counts is None else np.zeros((0, 4))
        frames.append((boxes, scores, np.asarray(found, np.float32).reshape(-1, 4)))
    what = sc.source if people is None else f"--people {people:g} (or its default)"
    if faces is not None:
        what += f", --faces {faces:g}"
    return Scene(frames, sc.detect_s, what, sc.high_score)


def _counts(mean: float, frames: int) -> list[int]:
    """`frames` integer counts whose mean is `mean` (e.g. 1.5 -> 1, 2, 1, 2, ...)."""
    return [int((i + 1) * mean + 1e-9) - int(i * mean + 1e-9) for i in range(frames)]


def _inbox_blocks(config: Config, index: int) -> bool:
    """Whether stage `index`'s inbox is `block` (its model queues then default to block)."""
    inbox = config.stages[index].inbox
    return inbox is not None and inbox.policy == "block"


def _rigs(config: Config) -> Callable[[Callable[[], int]], list[Any]] | None:
    """clock -> the config's rigs (its rig3d stages' frame groups on that clock), or None."""
    from stages.rig.stage import Rig3DOptions, rig_groups

    found = []
    for i in _stage_indices(config, "rig3d"):
        try:
            found.append(Rig3DOptions.model_validate(config.stages[i].options))
        except Exception as exc:
            raise PlanError(f"{config.path}: stages[{i}]: invalid rig3d options: {exc}") from None
    if not found:
        return None
    return lambda clock: [rig_groups(o, config, clock) for o in found]


def _dark_face_points(config: Any) -> bool:
    i = _stage_index(config, "dark")
    return bool(i is not None and config.stages[i].options.get("face_points", False))


def _push_cpu(config: Any, probes: list[CameraProbe]) -> float:
    """Core-seconds a second the zmq_push stages spend encoding frames (JPEG at their quality,
    measured on each camera's sampled frame; raw frames are sent from their own memory, no
    encoding)."""
    import cv2

    i = _stage_index(config, "zmq_push")
    if i is None or config.stages[i].options.get("format", "jpeg") != "jpeg":
        return 0.0
    quality = int(config.stages[i].options.get("quality", 90))
    total = 0.0
    for p in probes:
        if not p.frames:
            continue
        t0 = time.perf_counter()
        for _ in range(5):
            cv2.imencode(".jpg", p.frames[0], [cv2.IMWRITE_JPEG_QUALITY, quality])
        total += p.fps * (time.perf_counter() - t0) / 5
    return total


def _bottleneck(
    util: dict[str, dict[str, float]], costs: dict[str, ModelCost], config: Any, det_i: int | None
) -> str:
    """The first resource along the data flow (the CPU's cores, detect's thread, the NPU)
    that is asked more than it has, by name, and the others that are too; when none is,
    the busiest. Work a resource cannot take never reaches the next one."""
    ratios = {"cpu": util["cpu"]["asked"]}
    if "detect" in util:
        ratios["detect"] = util["detect"]["asked"] / max(util["detect"]["capacity"], 1e-9)
    if "npu" in util:
        ratios["npu"] = util["npu"]["asked"]

    def said(which: str) -> str:
        busy = f", {100 * util['npu']['predicted']:.0f}% busy" if which == "npu" else ""
        return f"{_name(which, util, costs, config, det_i)} (asks {100 * ratios[which]:.0f}%{busy})"

    # a pose refresh asks for each idle person only, so a full NPU may ask just under 100%:
    # busy all the time, it is at capacity
    full = "npu" in util and util["npu"]["predicted"] >= SATURATED
    over = [
        w
        for w in ("cpu", "detect", "npu")
        if w in ratios and (ratios[w] > 1 or (w == "npu" and full))
    ]
    if not over:
        busiest = max(ratios, key=ratios.__getitem__)
        return f"none: everything fits (the busiest is {said(busiest)})"
    also = "; also over capacity: " + ", ".join(said(w) for w in over[1:]) if over[1:] else ""
    return said(over[0]) + also


def _name(
    which: str, util: dict, costs: dict[str, ModelCost], config: Any, det_i: int | None
) -> str:
    if which == "detect":
        assert det_i is not None
        opts = config.stages[det_i].options
        person, face = opts.get("person", "blazepose"), opts.get("face", "blazeface")
        live = opts.get("live")
        if isinstance(live, dict) and live.get("enabled"):
            person = f"{person} + the per-frame landmark models"
        n = int(util["detect"]["workers"])
        threads = "one worker thread" if n == 1 else f"{n} worker threads"
        return (
            f"CPU: the detect stage {config.stage_names[det_i]!r} (person {person}, face "
            f"{face}; {threads})"
        )
    if which == "npu":
        by = {m: util["npu"].get(m, 0.0) for m in costs}
        top = max(by, key=by.__getitem__) if by else "?"
        c = costs.get(top)
        what = f"{top} as {c.released}" if c is not None and c.released else top
        return f"NPU: mostly {what}"
    return f"CPU: all {util['cpu']['cores']} cores"
