"""The NPU side of a plan: each enabled model's device time per pass (the calibrated NPU2
time of the released model it is or stands in for, npu.sim_cost; or measured on the
config's backend when it is not paced as NPU2), and a discrete-event run of the inference
stage's own scheduler (stages.planning.simulate) fed with the jobs the detect stage would
issue: its rate limits and intervals, the tracker's one pose job per idle track (or, for a
rig's cameras, the jobs of the rig's posed groups), the scene's people and faces, and the
results coming back."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npu import models
from npu.sim_cost import NPU2, ModelWork, Npu2Pacer
from pipeline.errors import NpucamError
from stages import job_policy
from stages.batches import Batch, ModelProfile, QueuedJob, QueuePolicy
from stages.context_lru import ContextShare
from stages.models.adaface.job import FaceJob
from stages.planning.simulate import SimClock, simulate
from stages.scheduler import BatchScheduler

NS = 1_000_000_000
SPREAD_S = 45.0  # the window of a minute's run after its start-up (bench/plan_accuracy.py)
# The spread (standard deviation) of a frame's capture time about its camera's even grid, s.
# A real camera never delivers an exact grid, and the plan must not either: with exact times
# an interval that is a whole number of frame periods (clip_interval_s 2 s at 25 fps) is met
# exactly at a tie and passes every time, where a run's frame is as often a moment early and
# waits one frame more (the demo's CLIP jobs on bikes.mp4: 0.45 a second planned on a grid,
# 0.42 with this jitter, 0.39 in a run). Measured on the demo's paced file cameras: frame
# gaps' standard deviation 1.5-1.7 ms, so 1.2 ms a frame (docs/benchmarks.md, plan accuracy).
CAPTURE_JITTER_S = 0.0012
MAX_WINDOW_STRETCH = 3.0  # whole_loops may lengthen the measured window up to this factor


class PlanError(NpucamError):
    """A config or option `npucam plan` cannot plan for."""


@dataclass(frozen=True)
class ModelCost:
    """One model's device time per pass and where it comes from. released: the released
    model it is priced as (None when measured); host_s: CPU seconds a pass spends on the
    device thread of this machine (the simulator computing a stand-in: sim only; a paced
    sim pass lasts max(pass_s, host_wall_s): `device_s`)."""

    model: str
    batch: int
    pass_s: float
    contexts: tuple[str, ...]
    source: str
    released: str | None = None
    host_s: float = 0.0
    host_wall_s: float = 0.0  # the same pass's wall time (a paced pass takes at least this)
    profile_cost_s: float = 0.0  # the scheduler's initial estimate (cost_s, else pass_s)
    work: ModelWork | None = field(default=None, repr=False, compare=False)

    @property
    def item_s(self) -> float:
        return self.pass_s / self.batch

    @property
    def device_s(self) -> float:
        """Seconds a pass holds the device in the run: on sim no less than its host work."""
        return max(self.pass_s, self.host_wall_s)


def _bundle_batch(name: str, bundle: Path | None) -> int:
    """Items per pass of model `name`: its bundle's batch param, else the registry's."""
    spec = models.spec(name)
    if bundle is None or not (bundle / "manifest.txt").is_file():
        return spec.default_batch
    from npu.bundle import Bundle

    b = Bundle.open(bundle)
    try:
        for key in ("batch", "v_batch"):
            if b.has_param(key):
                return b.param(key, int)
    finally:
        b.close()
    return spec.default_batch


def device_costs(
    config: Any,
    options: Any,
    overrides: dict[str, float],
    variants: dict[str, str],
    measure: bool,
) -> dict[str, ModelCost]:
    """Every enabled model's ModelCost. Paced as NPU2 (backend npu, or sim with pacing
    npu2): the calibrated time of its released variant (`variants`, then [stages.sim]
    pace_as, then its bundle's, then the synthetic model's stands_in_for); otherwise, or
    when no released variant is known on sim, measured (sim: the modelled time of its own
    dispatches, or with pacing none its host time; cpu: its wall time). measure: also time
    the stand-in's host work on sim (what the simulator computes per pass)."""
    from stages.runtimes import resolve

    backend = options.backend
    paced = backend == "npu" or (backend == "sim" and options.sim.pacing == "npu2")
    out: dict[str, ModelCost] = {}
    to_measure: list[str] = []
    for name in options.enabled():
        mo = options.model(name)
        raw = resolve(config.base_dir, mo.bundle)
        bundle = Path(raw) if raw else None
        synthetic = (bundle is None or not bundle.exists()) and mo.synthetic
        batch = _bundle_batch(name, None if synthetic else bundle)
        variant = variants.get(name) or (
            options.sim.pace_as.get(name) if backend == "sim" else None
        )
        if paced and variant is None:
            variant = models.released_variant(name, None if synthetic else bundle, synthetic)
        if name in overrides:
            out[name] = ModelCost(name, batch, overrides[name], (), "--cost")
        elif paced and variant is not None:
            work = models.npu2_work(name, variant)
            pw = work.passes["forward"]
            out[name] = ModelCost(
                name, pw.items, NPU2.pass_s(pw), work.contexts,
                f"calibrated NPU2 time of {work.name} (docs/device.md)", work.name, work=work,
            )  # fmt: skip
        elif backend == "npu":
            raise PlanError(
                f"{config.path}: {name}: no calibrated NPU2 time for {bundle} (not a released "
                "model): pass --cost MODEL=SECONDS or --as MODEL=VARIANT"
            )
        else:
            to_measure.append(name)
        if name in out:
            cost_s = mo.cost_s if mo.cost_s is not None else out[name].pass_s
            out[name] = _with(out[name], profile_cost_s=cost_s)
    if backend != "npu" and (to_measure or (measure and backend == "sim")):
        measured = _measure(config, options, to_measure, measure)
        for name, (batch, pass_s, cpu_s, wall_s, contexts, how) in measured.items():
            mo = options.model(name)
            if name in out:
                out[name] = _with(out[name], host_s=cpu_s, host_wall_s=wall_s)
            else:
                out[name] = ModelCost(
                    name, batch, pass_s, contexts, how, host_s=cpu_s, host_wall_s=wall_s,
                    profile_cost_s=mo.cost_s if mo.cost_s is not None else pass_s,
                )  # fmt: skip
    return {m: out[m] for m in options.enabled()}


def _with(cost: ModelCost, **changes: Any) -> ModelCost:
    from dataclasses import replace

    return replace(cost, **changes)


def _measure(
    config: Any, options: Any, names: list[str], host: bool
) -> dict[str, tuple[int, float, float, float, tuple[str, ...], str]]:
    """Load the enabled models as the stage would, each on a sim device that does not wait
    (or cpu), and time a pass after a warm-up: (batch, pass seconds, host CPU seconds, host
    wall seconds, contexts, how) for `names`; with `host`, also every other model on sim."""
    from stages.infer import open_stage_device
    from stages.runtimes import Pacing, open_runtime, resolve

    wanted = list(options.enabled()) if host and options.backend == "sim" else names
    sim_opts = options.model_copy(update={"sim": options.sim.model_copy(update={"pacing": "none"})})
    device = open_stage_device(sim_opts, config.base_dir)
    own = Pacing("stand-in")
    out = {}
    try:
        for name in wanted:
            mo = options.model(name)
            rt = open_runtime(
                name, options.backend, mo.source(config.base_dir, f"{config.path}: {name}"),
                device=device, options=mo, base_dir=config.base_dir,
                synthetic_cache=resolve(config.base_dir, options.synthetic_cache), pacing=own,
            )  # fmt: skip
            try:
                rt.warm_up()
                sim = getattr(device, "sim", None)
                before = sim.dispatch_s + sim.ctx_switch_s if sim is not None else 0.0
                cpu0 = time.thread_time()
                wall = rt.warm_up()
                cpu = time.thread_time() - cpu0
                if sim is None:
                    pass_s, how = wall, f"measured on {options.backend} (wall clock)"
                elif options.sim.pacing == "none":
                    pass_s, how = wall, "measured on sim (host time: pacing none)"
                else:
                    pass_s = sim.dispatch_s + sim.ctx_switch_s - before
                    how = "modelled time of its own dispatches (pacing stand-in)"
                if rt.synthetic:
                    how += ", synthetic"
                out[name] = (rt.batch_size, pass_s, cpu, wall, rt.contexts, how)
            finally:
                rt.close()
    finally:
        if device is not None:
            device.close()
    return out


# -- the discrete-event run ---------------------------------------------------------------


@dataclass
class CameraLoad:
    """One camera as the detect stage feeds infer: `rate` frames a second processed (after
    the CPU's limits) of `fps` delivered; frames: its detections per delivered frame
    (stages.planning.probe.Scene.frames), looping as a looping file does; staleness_s: the
    budget of its jobs."""

    name: str
    rate: float
    fps: float
    staleness_s: float
    frames: list[tuple[np.ndarray, np.ndarray, np.ndarray]]

    @property
    def loop_s(self) -> float:
        """Seconds of capture before its frames repeat."""
        return len(self.frames) / self.fps if self.fps > 0 else 0.0


@dataclass
class NpuOutcome:
    """What the scheduler did over the measured window (rates per second of it)."""

    window_s: float
    busy: float
    results: dict[str, dict[str, float]]  # model -> camera -> results/s
    drops: dict[str, dict[str, float]]  # model -> reason -> jobs/s
    jobs: dict[str, float]  # model -> jobs submitted/s
    passes: dict[str, float]  # model -> passes/s
    context_loads_s: float  # modelled context loads and switches, device-s/s
    # model -> (lowest, highest) results/s over any SPREAD_S of the window: how much a minute's
    # run can differ from the long-run rate
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)
    # model -> its share of the context budget at the end of the run (the scheduler's view:
    # what is resident, what it loaded, whose loads evicted its contexts)
    contexts: dict[str, ContextShare] = field(default_factory=dict)

    def results_per_s(self, model: str) -> float:
        return sum(self.results.get(model, {}).values())


def whole_loops(window_s: float, loops_s: list[float]) -> float:
    """window_s rounded up to whole loops of the longest scene, if that at most triples it:
    a looping scene's rates are then those of the whole clip, wherever the window starts
    (multicam-3d's rig cameras: bikes.mp4 at 5 fps is a 50 s loop with ~15 s without a
    person, and its plan over 120 s said 0.342 poses/s, over 150 s 0.327)."""
    longest = max(loops_s, default=0.0)
    if longest <= 0:
        return window_s
    whole = math.ceil(window_s / longest - 1e-9) * longest
    return whole if whole <= MAX_WINDOW_STRETCH * window_s else window_s


@dataclass
class _Camera:
    """The detect stage's state for one camera: its tracks (with their pose bookkeeping, as
    stages.tracks.CameraTracks holds it), a face tracker when there is no person detector,
    the job policy's interval marks, and pose-derived faces waiting for a frame."""

    load: CameraLoad
    tracks: Any
    faces: Any = None
    marks: dict[str, int] = field(default_factory=dict)  # job_policy.decide's interval marks
    pose_faces: list[int] = field(default_factory=list)
    rig: Any = None  # the camera's rig (stages.rig.groups.RigGroups), None outside one
    seq: int = 0  # frames it delivered


def _planned(policy: QueuePolicy) -> QueuePolicy:
    """The policy the plan simulates for a model queue (a held-back `block` job is refused)."""
    return "reject_new" if policy == "block" else policy


def simulate_npu(
    costs: dict[str, ModelCost],
    cameras: list[CameraLoad],
    detect: Any,
    infer: Any,
    *,
    face_points: bool = False,
    horizon_s: float = 150.0,
    warm_s: float = 30.0,
    infer_blocks: bool = False,
    rigs: Callable[[Callable[[], int]], list[Any]] | None = None,
) -> NpuOutcome:
    """Run the stage's scheduler on `costs` for horizon_s of simulated time, with the jobs
    detect (DetectOptions `detect`, None: no detect stage) issues on `cameras`, and report
    the window after warm_s, made whole loops of the longest camera scene (whole_loops).
    infer: the InferOptions (per-model max_wait_ms, queue, share; context slots;
    prepare_ahead_ms). face_points: the dark stage sends a face job per pose. infer_blocks:
    the infer stage's inbox is `block`. rigs: clock -> the config's rigs
    (stages.rig.groups.RigGroups on that clock), whose cameras are posed by group."""
    if not horizon_s > warm_s:
        raise PlanError(
            f"--horizon {horizon_s:g} s leaves nothing after the {warm_s:g} s warm-up: give more"
        )
    window_s = whole_loops(horizon_s - warm_s, [c.loop_s for c in cameras])
    warm_ns, end_ns = round(warm_s * NS), round((warm_s + window_s) * NS)
    run = _Run(costs, detect, _scheduler(costs, infer, infer_blocks), warm_ns, face_points)
    run.add_cameras(cameras, rigs)
    report = simulate(
        run.sched, run.clock, run.events(end_ns), run.device_s, end_ns,
        on_complete=run.on_complete,
    )  # fmt: skip
    return run.outcome(report, end_ns)


def _scheduler(
    costs: dict[str, ModelCost], infer: Any, infer_blocks: bool
) -> tuple[BatchScheduler, SimClock]:
    """The infer stage's scheduler over `costs` (InferOptions `infer`), on a SimClock at 0."""
    from npu.device import ctx_cache_cap

    clock = SimClock(0)
    profiles = []
    for m, c in costs.items():
        mo = infer.model(m)
        profiles.append(
            ModelProfile(
                name=m,
                batch_size=c.batch,
                max_wait_ms=mo.max_wait_ms,
                contexts=c.contexts,
                cost_s=c.profile_cost_s or c.pass_s,
                queue_size=mo.queue_size,
                # a plan models live cameras: a job a full `block` queue holds back waits
                # upstream, where newer frames replace it, so the plan counts it refused
                queue_policy=_planned(mo.policy(infer_blocks)),
                share=mo.share,
            )  # fmt: skip
        )
    sched = BatchScheduler(
        profiles,
        clock=clock,
        context_slots=infer.context_slots or ctx_cache_cap(),
        prepare_ahead_s=infer.prepare_ahead_ms / 1000,
        model_window_s=infer.model_window_s,
    )
    return sched, clock


class _Run:
    """One simulate_npu run: the scheduler on its clock, the detect stage's state per camera,
    the jobs it submits (stages.job_policy, as stages.detect.Detect.process) and what comes
    back (as the dark stage: a finished pose refresh, its face job)."""

    def __init__(
        self,
        costs: dict[str, ModelCost],
        detect: Any,
        scheduler: tuple[BatchScheduler, SimClock],
        warm_ns: int,
        face_points: bool,
    ) -> None:
        from stages.runtimes import runtime_class

        self.costs, self.detect, self.warm_ns, self.face_points = (
            costs, detect, warm_ns, face_points,
        )  # fmt: skip
        self.sched, self.clock = scheduler
        declared = [(m, models.spec(m).runs_on) for m in costs]
        self.wanted = [] if detect is None else job_policy.wanted(declared, detect)
        self.cadence = {w.model: w.runs_on.cadence for w in self.wanted}
        # the dark stage's faces of poses are FaceJobs: they go to the model that takes those
        self.pose_face_models = [m for m in costs if runtime_class(m).job_type is FaceJob]
        self.pacer = Npu2Pacer()
        for m, c in costs.items():  # as the stage tells it for a paced model (stages/infer.py)
            if c.work is not None:
                self.sched.observe_context_cost(m, self.pacer.costs.ctx_load_s)
        self.extra_s = 0.0  # modelled context loads and switches in the window
        self.cams: dict[str, _Camera] = {}
        self.submitted: Counter = Counter()
        self.results: defaultdict[str, Counter] = defaultdict(Counter)
        self.done_at: defaultdict[str, list[int]] = defaultdict(list)  # model -> result times
        self.drops_before: Counter = Counter()

    def add_cameras(
        self, cameras: list[CameraLoad], rigs: Callable[[Callable[[], int]], list[Any]] | None
    ) -> None:
        from stages.detect import person_tracker
        from stages.tracks import CameraTracks

        detect = self.detect
        for c in cameras:
            cam = _Camera(c, CameraTracks(person_tracker(detect.tracker, c.name)))
            if detect.person == "none":
                cam.faces = person_tracker(detect.tracker, c.name)
            self.cams[c.name] = cam
        for rig in rigs(self.clock) if rigs is not None else []:
            for name in rig.cameras:
                if name in self.cams:
                    self.cams[name].rig = rig

    def device_s(self, batch: Batch) -> float:
        c = self.costs[batch.model]
        if c.work is None:
            return c.device_s
        charge = self.pacer.charge(c.work)
        if self.clock.t >= self.warm_ns:
            self.extra_s += charge.total_s - charge.pass_s
        return max(charge.total_s, c.host_wall_s)

    def submit(
        self, model: str, cam: str, payload: tuple, t: int, key: Any, prio: int, group: Any = None
    ) -> None:
        deadline = t + round(self.cams[cam].load.staleness_s * NS)
        self.sched.submit(QueuedJob(model, cam, payload, deadline, prio, key, t, group))
        if t >= self.warm_ns:
            self.submitted[model] += 1

    def frame(self, cam: _Camera, t: int, nominal: int) -> None:
        """What stages.detect.Detect.process does with one frame captured at t (its slot of
        the camera's grid: nominal), minus the detectors: the same targets, the same job
        policy (stages.job_policy), a job per pick keyed and ordered as its runtime would."""
        load, detect = cam.load, self.detect
        boxes, scores, face_boxes = load.frames[int(nominal * load.fps / NS) % len(load.frames)]
        tracks = cam.tracks
        tracked = tracks.tracker.update(boxes, scores, t)
        tracks.expire_poses(t)
        cam.seq += 1
        deadline = t + round(load.staleness_s * NS)
        tag = None if cam.rig is None else cam.rig.place(load.name, cam.seq, t, deadline, (0, 0))
        if cam.rig is not None and cam.rig.live:  # posed by the per-frame poses: Sapiens2
            tag = None  # refreshes its tracks as keyframes, as a camera of no rig
        targets = _targets(cam, detect, tracked, boxes, face_boxes, tag, t)
        picked = job_policy.decide(self.wanted, targets, t, cam.marks, refresh_all=tag is not None)
        for m, target in picked:
            tid, refresh = target.track_id, self.cadence[m] == "refresh"
            key: tuple | None = None if tid is None else (m, load.name, tid)
            if key is not None and target.kind == "face":
                key = (*key, target.landmark_source)
            since = target.since_ns
            prio = (-1 if since is None else since) if refresh else 0
            self.submit(m, load.name, (self.cadence[m], tid), t, key, prio, target.group)
            if refresh and tid is not None:
                tracks.tracker.pose_started(tid)
                retry = detect.pose_retry_s
                tracks.pose_deadlines[tid] = (
                    deadline if retry is None else min(deadline, t + round(retry * NS))
                )
        if detect.faces:
            for p in cam.pose_faces:
                for m in self.pose_face_models:
                    self.submit(m, load.name, ("face", p), t, (m, load.name, p, "sapiens2"), 0)
            cam.pose_faces.clear()

    def on_complete(self, batch: Batch, returned: list) -> None:
        t = self.clock.t
        for job, _ in returned:
            if t >= self.warm_ns:
                self.results[job.model][job.camera] += 1
                self.done_at[job.model].append(t)
            cadence, who = job.payload
            if cadence != "refresh":
                continue
            cam = self.cams[job.camera]
            cam.tracks.finish_pose(who, job.capture_ts_ns, t)  # as the dark stage does
            if self.face_points:
                cam.pose_faces.append(who)

    def snapshot(self) -> None:
        self.drops_before = Counter(self.sched.stats.drops)

    def events(self, end_ns: int) -> list[tuple[int, Any]]:
        """The drop counters' snapshot at the window's start, and each camera's frames until
        end_ns: its grid (a rig's cameras at its first one's phase), jittered by
        CAPTURE_JITTER_S (seeded: one config gives one plan)."""
        cams = self.cams
        events: list[tuple[int, Any]] = [(self.warm_ns, self.snapshot)]
        rng = np.random.default_rng(0)
        order = list(cams)
        for k, cam in enumerate(cams.values()):
            if cam.load.rate <= 0 or not cam.load.frames:
                continue
            period = NS / cam.load.rate
            if cam.rig is not None:
                k = min(order.index(c) for c in cam.rig.cameras if c in cams)
            phase = round(period * k / max(len(cams), 1))
            spread = min(CAPTURE_JITTER_S * NS, period / 8)  # frames stay in order
            j = 0
            while (nominal := phase + round(j * period)) < end_ns:
                t = max(0, nominal + round(spread * float(np.clip(rng.standard_normal(), -2, 2))))
                events.append(
                    (t, lambda cam=cam, t=t, nominal=nominal: self.frame(cam, t, nominal))
                )
                j += 1
        return events

    def outcome(self, report: Any, end_ns: int) -> NpuOutcome:
        """What the scheduler did over the window [warm_ns, end_ns), per second of it."""
        warm_ns = self.warm_ns
        window = (end_ns - warm_ns) / NS
        busy = sum(max(0, min(b, end_ns) - max(a, warm_ns)) for a, b, _ in report.batches) / (
            end_ns - warm_ns
        )
        drops: dict[str, dict[str, float]] = defaultdict(dict)
        for (m, cam, reason), n in self.sched.stats.drops.items():
            d = n - self.drops_before.get((m, cam, reason), 0)
            if d:
                drops[m][reason] = drops[m].get(reason, 0.0) + d / window
        passes: Counter = Counter(b.model for a, _, b in report.batches if a >= warm_ns)
        return NpuOutcome(
            spread=_spread(self.done_at, warm_ns, end_ns, window),
            window_s=window,
            busy=busy,
            results={m: {c: n / window for c, n in r.items()} for m, r in self.results.items()},
            drops=dict(drops),
            jobs={m: n / window for m, n in self.submitted.items()},
            passes={m: n / window for m, n in passes.items()},
            context_loads_s=self.extra_s / window,
            contexts=self.sched.context_view(),
        )


def _spread(
    done_at: dict[str, list[int]], warm_ns: int, end_ns: int, window: float
) -> dict[str, tuple[float, float]]:
    """model -> (lowest, highest) results/s over any SPREAD_S of the window, every 5 s."""
    spread = {}
    span = round(min(SPREAD_S, window) * NS)
    for m, times in done_at.items():
        rates = []
        for start in range(warm_ns, end_ns - span + 1, 5 * NS):
            n = sum(1 for t in times if start <= t < start + span)
            rates.append(n / (span / NS))
        if rates:
            spread[m] = (min(rates), max(rates))
    return spread


def _targets(
    cam: _Camera, detect: Any, tracked: list, boxes: np.ndarray, face_boxes: np.ndarray,
    tag: Any, t: int,
) -> list[job_policy.Target]:  # fmt: skip
    """A frame's targets as stages.detect.Detect.process makes them: the tracked persons
    (with their refresh places: the pose queue's order, or a posed rig group's chosen
    people), the faces (with their detector's landmarks), the regions and the frame."""
    tracks = cam.tracks
    ids: list[int | None] = [None] * len(boxes)
    for tb in tracked:
        ids[tb.detection] = tb.track_id
    boxed = {tb.track_id: tb.box for tb in tracked}
    rig = None if cam.rig is not None and cam.rig.live else cam.rig
    targets = job_policy.person_targets(tracks.tracker, boxed, detect.pose, rig, tag)
    face_ids = _face_tracks(cam, face_boxes, boxes, ids, t)
    if detect.face != "none":
        source = "yunet" if detect.face == "yunet" else "blazeface"
        targets += [
            job_policy.Target("face", job_policy.xywh(b), track_id=f, landmark_source=source)
            for b, f in zip(face_boxes, face_ids, strict=True)
        ]
    if detect.clip != "off":
        xywh = {tid: job_policy.xywh(b) for tid, b in boxed.items()}
        targets += job_policy.regions(xywh, (0, 0), detect.clip == "frame")
    targets.append(job_policy.Target("frame"))
    return targets


def _face_tracks(
    cam: _Camera, faces: np.ndarray, people: np.ndarray, ids: list[int | None], t: int
) -> list[int | None]:
    """Each face's track: its own face track without a person detector, else the smallest
    person box containing its centre (stages.detect)."""
    if cam.faces is not None:
        got: list[int | None] = [None] * len(faces)
        for tb in cam.faces.update(faces, np.ones(len(faces), np.float32), t):
            got[tb.detection] = tb.track_id
        return got
    out: list[int | None] = []
    for x1, y1, x2, y2 in faces:
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        best, area = None, np.inf
        for (a1, b1, a2, b2), tid in zip(people, ids, strict=True):
            size = (a2 - a1) * (b2 - b1)
            if tid is not None and a1 <= cx <= a2 and b1 <= cy <= b2 and size < area:
                best, area = tid, size
        out.append(best)
    return out


def context_budget(costs: dict[str, ModelCost], slots: int) -> dict[str, Any]:
    """Which models' contexts fit the device together, and what alternating costs when they
    do not: {slots, needed, fits, per_model, reload_s (one round of every model's loads)}."""
    per = {m: len(c.contexts) for m, c in costs.items()}
    needed = sum(per.values())
    fits = needed <= slots
    reload_s = 0.0 if fits else sum(n * NPU2.ctx_load_s for n in per.values())
    return {
        "slots": slots,
        "needed": needed,
        "fits": fits,
        "per_model": per,
        "switch_s": NPU2.ctx_switch_s,
        "load_s": NPU2.ctx_load_s,
        "reload_round_s": reload_s,
    }
