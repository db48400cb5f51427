"""The inference stage: one stage, one device, every model (ARCHITECTURE.md section 3).

Pose, face and CLIP jobs (stages.jobs) enter per-model queues of a BatchScheduler
(stages.scheduler; docs/scheduler.md) with their frames' deadlines. The scheduler hands out
batches of exactly each model's export size (padded and masked), closed when full or when
the oldest job has waited the model's max_wait_ms, chosen by deadline and device cost with
per-camera fairness and a preference for models whose contexts are resident; stale jobs are
dropped and counted. The host glue of the next batch (stages.runtimes: crops, preprocessing)
runs in one worker thread while the current batch runs on the device in another (the only
thread that touches the device, so XRT objects stay on one thread). Each real slot leaves as
an `Inferred` of its kind (stages.jobs: PoseInferred, FaceInferred, ClipInferred) naming
backend, model and whether the weights are synthetic.

A device error, or a malformed pass report the scheduler refuses (wrong output count, bad
device time), fails that batch's jobs (dropped `error`, counted per model and camera) and
the stage goes on; running out of hardware contexts makes the device's LRU evict, not fail.
Its scheduler and device numbers are registered as stage gauges (`<stage>` and
`<stage>/<model>`) with pipeline.metrics, so they are on the `stats` topic and Prometheus.
Configuration keys: docs/configuration.md ("infer stage"); design: docs/inference.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from pipeline.config import Config
from pipeline.graph import Stage, StageOptions
from pipeline.messages import now_ns
from stages.jobs import ClipJob, FaceJob, Job, PoseJob, inferred_type
from stages.runtimes import (
    MODELS,
    ClipRuntime,
    LabelsFileError,
    ModelSource,
    Ran,
    Runtime,
    open_runtime,
    read_labels_file,
)
from stages.scheduler import Batch, BatchScheduler, ModelProfile, SchedulerError
from stages.scheduler import Job as SchedJob

log = logging.getLogger(__name__)

MODEL_OF: dict[type, str] = {PoseJob: "sapiens2", FaceJob: "adaface", ClipJob: "clip"}
ERROR_LOG_LINES = 5


def _run_prepared(rt: Runtime, glue: Future) -> Ran:
    """On the device thread: wait for a batch's host glue, then run it."""
    return rt.run(glue.result())


SECOND_WARM_UP_S = 5.0  # a first pass shorter than this is followed by the measured one


def _measured_cost(rt: Runtime) -> float:
    """A model's initial pass cost: its first pass pays one-time work (kernel and context
    loads, weight unpacking, caches), so when that pass is short a second one is measured."""
    first = rt.warm_up()
    return rt.warm_up() if first < SECOND_WARM_UP_S else first


class ModelOptions(StageOptions):
    """One model's keys: [stages.sapiens2], [stages.adaface] (a table in the infer stage)."""

    enabled: bool = False
    checkpoint: str | None = Field(None, min_length=1)  # backend cpu: HF / cvlface directory
    bundle: str | None = Field(None, min_length=1)  # backends sim, npu: bundle directory
    synthetic: bool = False  # no checkpoint / bundle: use the synthetic model (else fail)
    max_wait_ms: float = Field(0.0, ge=0)  # a partial batch closes after its oldest waited this
    queue_size: int = Field(16, ge=1, le=100_000)
    queue_policy: Literal["drop_oldest", "reject_new"] = "drop_oldest"
    cost_s: float | None = Field(None, gt=0)  # initial pass cost; default: measured warm-up
    share: float = Field(1.0, gt=0)  # weight in the device-time split between models

    def source(self, base_dir: Path, where: str) -> ModelSource:
        """Where this model's weights come from, its paths resolved against the config's dir."""
        return ModelSource(
            checkpoint=_resolve(base_dir, self.checkpoint),
            bundle=_resolve(base_dir, self.bundle),
            synthetic=self.synthetic,
            where=where,
        )


class ClipOptions(ModelOptions):
    """[stages.clip]: the model keys plus the zero-shot labels and prompt template.

    labels_file (relative to the config file): one label per line, re-read when it changes
    while the stage runs; once readable it wins over `labels` (stages.runtimes.ClipRuntime)."""

    max_wait_ms: float = Field(150.0, ge=0)
    labels: list[str] = []
    labels_file: str | None = Field(None, min_length=1)
    template: str | None = None  # default: the bundle's prompt_template, "a photo of a {}"


class SimOptions(StageOptions):
    """[stages.sim]: the simulated device (backend sim). Rates are npu.sim.CostModel's."""

    sleep: bool = True  # wait out the modelled device time (wall clock ~ device clock)
    gemm_flops_per_s: float = Field(1.6e12, gt=0)
    mha_flops_per_s: float = Field(1.2e12, gt=0)
    default_flops_per_s: float = Field(1.0e12, gt=0)
    bytes_per_s: float = Field(60e9, gt=0)
    dispatch_s: float = Field(50e-6, ge=0)
    ctx_switch_s: float = Field(2.9e-3, ge=0)
    ctx_create_s: float = Field(30e-3, ge=0)
    hwctx_limit: int = Field(16, ge=1)  # machine-wide contexts (shared with other processes)
    registry_dir: str | None = Field(None, min_length=1)  # default $NPUCAM_SIM_HWCTX_DIR


class InferOptions(StageOptions):
    backend: Literal["cpu", "sim", "npu"]
    sapiens2: ModelOptions = ModelOptions()
    adaface: ModelOptions = ModelOptions()
    clip: ClipOptions = ClipOptions()
    sim: SimOptions = SimOptions()
    context_slots: int | None = Field(None, ge=1)  # modelled LRU; default TACONITE_CTX_CACHE/16
    prepare_ahead_ms: float = Field(200.0, ge=0)  # hand out the next batch this early
    synthetic_cache: str | None = Field(None, min_length=1)  # default <asset cache>/synthetic


def _model_options(options: InferOptions, name: str) -> ModelOptions:
    return getattr(options, name)


def _resolve(base: Path, raw: str | None) -> str | None:
    if raw is None:
        return None
    p = Path(raw).expanduser()
    return str(p if p.is_absolute() else base / p)


class Infer(Stage):
    """The NPU stage (see the module docstring)."""

    kind = "infer"
    accepts = (PoseJob, FaceJob, ClipJob)
    Options = InferOptions

    def __init__(self, name: str, options: InferOptions, context: Any) -> None:
        super().__init__(name, options, context)
        self.base_dir = Path(getattr(context.config, "base_dir", Path.cwd()))
        self.device: Any = None
        self.runtimes: dict[str, Runtime] = {}
        self.scheduler: BatchScheduler | None = None
        self.errors: Counter = Counter()  # model -> jobs failed with `error`
        self.last_error: dict[str, str] = {}
        self.published: Counter = Counter()  # model -> results sent on
        self._mirrored: Counter = Counter()
        self._device_pool: ThreadPoolExecutor | None = None
        self._prep_pool: ThreadPoolExecutor | None = None
        self._wake = asyncio.Event()
        self._feeding = True

    # -- configuration -----------------------------------------------------------------

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        """Every enabled model's path for the backend exists, or synthetic is allowed."""
        try:
            options = InferOptions.model_validate(config.stages[index].options)
        except Exception:
            return []  # check_stages reported the validation errors
        problems = []
        enabled = [m for m in MODELS if _model_options(options, m).enabled]
        if not enabled:
            problems.append(
                f"stages[{index}]: no model enabled (set enabled = true in one of "
                + ", ".join(f"[stages.{m}]" for m in MODELS)
                + ")"
            )
        key = "checkpoint" if options.backend == "cpu" else "bundle"
        for m in enabled:
            mo = _model_options(options, m)
            raw = getattr(mo, key)
            path = _resolve(config.base_dir, raw)
            if path is not None and Path(path).exists():
                continue
            if mo.synthetic and options.backend != "npu":
                continue
            what = "is not set" if raw is None else f"{path} does not exist"
            fix = (
                "synthetic models run on cpu and sim only"
                if mo.synthetic
                else "or set synthetic = true"
            )
            problems.append(f"stages[{index}].{m}.{key}: {what} (backend {options.backend}; {fix})")
        clip = options.clip
        if clip.enabled and not clip.labels:
            if clip.labels_file is None:
                problems.append(
                    f"stages[{index}].clip.labels: CLIP needs at least one label "
                    "(in labels or in a labels_file)"
                )
            else:
                try:
                    read_labels_file(_resolve(config.base_dir, clip.labels_file))
                except LabelsFileError as exc:
                    problems.append(
                        f"stages[{index}].clip.labels_file: {exc} (and labels is empty)"
                    )
        return problems

    # -- startup (device thread) --------------------------------------------------------

    def _open_device(self) -> Any:
        backend = self.options.backend
        if backend == "cpu":
            return None
        if backend == "npu":
            from npu.xrt import open_device

            return open_device()
        from npu.sim import CostModel, SimDevice

        s = self.options.sim
        cost = CostModel(
            flops_per_s=(("gemm", s.gemm_flops_per_s), ("mha", s.mha_flops_per_s)),
            default_flops_per_s=s.default_flops_per_s,
            bytes_per_s=s.bytes_per_s,
            dispatch_s=s.dispatch_s,
            ctx_create_s=s.ctx_create_s,
            ctx_switch_s=s.ctx_switch_s,
        )
        registry = _resolve(self.base_dir, s.registry_dir)
        return SimDevice(cost, sleep=s.sleep, registry_dir=registry, hwctx_limit=s.hwctx_limit)

    def _open(self) -> list[ModelProfile]:
        """Open the device, load every enabled model, measure a warm-up pass of each."""
        opts = self.options
        self.device = self._open_device()
        profiles = []
        for name in MODELS:
            mo = _model_options(opts, name)
            if not mo.enabled:
                continue
            clip = name == "clip"
            rt = open_runtime(
                name,
                opts.backend,
                mo.source(self.base_dir, f"stage {self.name}: {name}"),
                device=self.device,
                max_wait_ms=mo.max_wait_ms,
                labels=opts.clip.labels if clip else (),
                template=opts.clip.template if clip else None,
                labels_file=_resolve(self.base_dir, opts.clip.labels_file) if clip else None,
                synthetic_cache=_resolve(self.base_dir, opts.synthetic_cache),
            )
            self.runtimes[name] = rt
            cost = mo.cost_s if mo.cost_s is not None else max(_measured_cost(rt), 1e-4)
            log.info(
                "stage %s: %s on %s: model %s%s, export batch %d, %d contexts, "
                "pass cost %.4f s (%s)",
                self.name,
                name,
                opts.backend,
                rt.model_id,
                " (SYNTHETIC weights)" if rt.synthetic else "",
                rt.batch_size,
                len(rt.contexts),
                cost,
                "configured" if mo.cost_s is not None else f"measured, {opts.backend}",
            )
            profiles.append(
                ModelProfile(
                    name=name,
                    batch_size=rt.batch_size,
                    max_wait_ms=mo.max_wait_ms,
                    contexts=rt.contexts,
                    cost_s=cost,
                    queue_size=mo.queue_size,
                    queue_policy=mo.queue_policy,
                    share=mo.share,
                )
            )
        return profiles

    def _close(self) -> None:
        for rt in self.runtimes.values():
            try:
                rt.close()
            except Exception:
                log.exception("stage %s: closing %s failed", self.name, rt.name)
        if self.device is not None:
            self.device.close()

    # -- the run ------------------------------------------------------------------------

    async def run(self, inbox: Any, out: Any) -> None:
        loop = asyncio.get_running_loop()
        self._device_pool = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-device")
        self._prep_pool = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-prepare")
        feeder: asyncio.Task | None = None
        try:
            profiles = await loop.run_in_executor(self._device_pool, self._open)
            from npu.device import ctx_cache_cap

            self.scheduler = BatchScheduler(
                profiles,
                context_slots=self.options.context_slots or ctx_cache_cap(),
                prepare_ahead_s=self.options.prepare_ahead_ms / 1000,
            )
            self.metrics.add_gauges(self.name, self.device_gauges)
            for model in self.runtimes:
                self.metrics.add_gauges(
                    f"{self.name}/{model}", functools.partial(self.model_gauges, model)
                )
            feeder = asyncio.create_task(self._feed(inbox))
            await self._serve(out, feeder)
            await feeder  # re-raises a feeder failure
        finally:
            if feeder is not None and not feeder.done():
                feeder.cancel()
            self._device_pool.submit(self._close)  # after any run still on the device thread
            self._device_pool.shutdown(wait=False, cancel_futures=False)
            self._prep_pool.shutdown(wait=False, cancel_futures=True)
            if self.scheduler is not None:
                self._log_summary()

    async def _feed(self, inbox: Any) -> None:
        assert self.scheduler is not None
        try:
            async for item in inbox:
                self.submit(item)
        finally:
            self._feeding = False
            self._wake.set()

    def submit(self, item: Job) -> bool:
        """Queue one job for its model; False if dropped at once (counted)."""
        assert self.scheduler is not None
        model = MODEL_OF.get(type(item))
        if model is None or model not in self.runtimes:
            self.metrics.drop(f"{self.name}/{model or 'unknown'}", item.camera, "error")
            self.errors[model or "unknown"] += 1
            if self.errors[model or "unknown"] <= ERROR_LOG_LINES:
                log.error(
                    "stage %s: camera %s: %s but model %s is not enabled; dropped",
                    self.name,
                    item.camera,
                    type(item).__name__,
                    model,
                )
            return False
        priority = 0
        key = None
        if isinstance(item, PoseJob):
            # the oldest pose first: never-posed tracks, then by when the last pose was taken
            priority = (
                -1 if item.pose_age_s is None else item.capture_ts_ns - round(item.pose_age_s * 1e9)
            )
        track = getattr(item, "track_id", None)
        if track is not None:
            key = (model, item.camera, track)
        ok = self.scheduler.submit(
            SchedJob(
                model=model,
                camera=item.camera,
                payload=item,
                deadline_ns=item.deadline_ns,
                priority=priority,
                key=key,
            )
        )
        self._sync_drops()
        self._wake.set()
        return ok

    def _sync_drops(self) -> None:
        """Mirror the scheduler's drop counters into the pipeline metrics."""
        assert self.scheduler is not None
        for (model, camera, reason), n in self.scheduler.stats.drops.items():
            k = (model, camera, reason)
            new = n - self._mirrored[k]
            if new:
                self._mirrored[k] = n
                self.metrics.drop(f"{self.name}/{model}", camera, reason, new)

    async def _serve(self, out: Any, feeder: asyncio.Task) -> None:
        """Dispatch, prepare (worker thread), run (device thread), publish; until the inbox
        has closed and every queued job is done or dropped.

        A dispatched batch goes to both threads at once: its host glue to the prepare
        thread, and a run that waits for that glue to the device thread's FIFO, so the
        device starts the next batch the moment the current one ends (in dispatch order),
        without a round trip through the event loop. The loop only reports and publishes.
        """
        sched = self.scheduler
        assert sched is not None and self._prep_pool is not None
        assert self._device_pool is not None
        in_flight: deque[tuple[Batch, asyncio.Future]] = deque()
        while True:
            while (batch := sched.next_batch()) is not None:
                rt = self.runtimes[batch.model]
                for job in batch.jobs:
                    wait_s = (batch.dispatch_ns - job.enqueue_ns) / 1e9
                    self.metrics.observe_queue_wait(f"{self.name}/{batch.model}", wait_s)
                glue = self._prep_pool.submit(rt.prepare, [job.payload for job in batch.jobs])
                ran = self._device_pool.submit(_run_prepared, rt, glue)
                in_flight.append((batch, asyncio.wrap_future(ran)))
            self._sync_drops()
            if in_flight and in_flight[0][1].done():
                batch, fut = in_flight.popleft()
                await self._finish(batch, fut, out)
                continue  # the scheduler now sees the device free: dispatch first
            if not in_flight and not self._feeding and sched.pending() == 0:
                return
            if feeder.done() and feeder.exception() is not None:
                return
            self._wake.clear()
            waker = asyncio.ensure_future(self._wake.wait())
            waits: set[asyncio.Future] = {waker}
            if in_flight:
                waits.add(in_flight[0][1])
            wake_ns = sched.wake_ns()
            timeout = None if wake_ns is None else max((wake_ns - now_ns()) / 1e9, 0.0) + 1e-4
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()

    def _failed(self, batch: Batch, exc: BaseException, device_s: float) -> None:
        assert self.scheduler is not None
        self.scheduler.fail(batch, device_s)
        self._sync_drops()
        self._record_error(batch.model, len(batch.jobs), exc, batch.jobs[0].camera)

    def _record_error(self, model: str, n: int, exc: BaseException, camera: str) -> None:
        self.errors[model] += n
        self.last_error[model] = f"{type(exc).__name__}: {exc}"
        if self.errors[model] <= ERROR_LOG_LINES:
            log.error(
                "stage %s: %s failed on camera %s (%d job(s) dropped): %s",
                self.name,
                model,
                camera,
                n,
                self.last_error[model],
            )

    async def _finish(self, batch: Batch, fut: asyncio.Future, out: Any) -> None:
        """Report a device pass to the scheduler and send on its fresh, real results."""
        assert self.scheduler is not None
        rt = self.runtimes[batch.model]
        try:
            ran = fut.result()
        except Exception as exc:
            self._failed(batch, exc, 0.0)
            return
        try:
            returned = self.scheduler.complete(batch, ran.outputs, ran.device_s)
        except SchedulerError as exc:  # a malformed report: that batch fails, not the stage
            valid_s = ran.device_s if math.isfinite(ran.device_s) and ran.device_s >= 0 else 0.0
            self._failed(batch, exc, valid_s)
            return
        self.metrics.observe_work(f"{self.name}/{batch.model}", ran.device_s)
        self._sync_drops()
        real = max(len(batch.jobs), 1)
        extra = rt.extra()
        for sched_job, slot in returned:
            job = sched_job.payload
            if slot.error is not None or slot.output is None:
                self.metrics.drop(f"{self.name}/{batch.model}", job.camera, "error")
                self._record_error(
                    batch.model, 1, slot.error or ValueError("no output"), job.camera
                )
                continue
            if job.expired():
                self.metrics.drop(f"{self.name}/{batch.model}", job.camera, "stale")
                continue
            if isinstance(job, PoseJob):
                job.window = slot.window
            self.published[batch.model] += 1
            await out.send(
                inferred_type(job)(
                    job=job,
                    output=slot.output,
                    backend=rt.backend,
                    model=rt.model_id,
                    synthetic=rt.synthetic,
                    device_s=ran.device_s / real,
                    extra=dict(extra),
                )
            )

    # -- reporting ----------------------------------------------------------------------

    def stats(self) -> dict:
        """The stage's scheduler and device numbers as JSON-able data (scheduler metrics of
        docs/scheduler.md, plus per model its backend, model id, synthetic flag and errors)."""
        assert self.scheduler is not None
        snap = self.scheduler.stats.snapshot(now_ns())
        snap["backend"] = self.options.backend
        snap["runtimes"] = {
            name: {
                "model": rt.model_id,
                "synthetic": rt.synthetic,
                "batch_size": rt.batch_size,
                "contexts": len(rt.contexts),
                "published": self.published[name],
                "errors": self.errors[name],
                "last_error": self.last_error.get(name),
            }
            for name, rt in self.runtimes.items()
        }
        if self.device is not None:
            st = self.device.stats
            snap["device"] = {"loads": st.loads, "hits": st.hits, "evictions": st.evict}
            sim = getattr(self.device, "sim", None)
            if sim is not None:
                snap["device"]["sim_device_time_s"] = sim.device_time_s
        return snap

    def device_gauges(self) -> dict[str, float]:
        """The stage's device-wide gauges (the `<stage>` entry of pipeline.metrics): busy
        fraction and seconds, context loads / evictions as the scheduler models them, and the
        device's own context counters when there is a device. Read from any thread."""
        assert self.scheduler is not None
        st = self.scheduler.stats
        gauges: dict[str, float] = {
            "device_busy_fraction": st.busy_fraction(now_ns()),
            "device_busy_seconds": st.busy_s,
            "context_loads": st.context_loads,
            "context_evictions": st.context_evictions,
            "queued": self.scheduler.pending(),
            "in_flight": len(self.scheduler.in_flight),
        }
        if self.device is not None:
            dev = self.device.stats
            gauges["device_context_loads"] = dev.loads
            gauges["device_context_hits"] = dev.hits
            gauges["device_context_evictions"] = dev.evict
        return gauges

    def model_gauges(self, model: str) -> dict[str, float]:
        """One model's gauges (the `<stage>/<model>` entry of pipeline.metrics): batches,
        fill ratio, padded slots, padding waste, queue wait mean / max (submit to dispatch),
        the learned pass cost and its bound, queued jobs, published results and errors; for
        CLIP also the labels in effect, label sets encoded and labels-file errors."""
        assert self.scheduler is not None
        m = self.scheduler.stats.models[model]
        gauges = {
            "batches": m.batches,
            "fill_ratio": m.fill_ratio,
            "padded_slots": m.slots - m.filled,
            "padding_waste_seconds": m.padding_waste_s,
            "queue_wait_mean_seconds": m.mean_wait_s,
            "queue_wait_max_seconds": m.wait_s_max,
            "cost_estimate_seconds": self.scheduler.cost_estimate_s(model),
            "cost_bound_seconds": self.scheduler.cost_bound_s(model),
            "queued": self.scheduler.pending(model),
            "published": self.published[model],
            "errors": self.errors[model],
        }
        rt = self.runtimes.get(model)
        if isinstance(rt, ClipRuntime):
            gauges["labels"] = len(rt.labels)
            gauges["label_sets_loaded"] = rt.label_sets_loaded
            gauges["label_file_errors"] = rt.label_errors
        return gauges

    def _log_summary(self) -> None:
        s = self.stats()
        drops = self.scheduler.stats.drops_by_reason() if self.scheduler else {}
        log.info(
            "stage %s: device busy %.1f%% (%s), published %s, drops %s, context loads %d "
            "evictions %d",
            self.name,
            100 * s["device_busy_fraction"],
            self.options.backend,
            dict(self.published),
            dict(drops),
            s["context_loads"],
            s["context_evictions"],
        )
