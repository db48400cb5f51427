"""The inference stage: one stage, one device, every model (docs/inference.md).

Each model's jobs (PoseJob, FaceJob, ClipJob: stages/models/<model>/job.py) enter per-model
queues of a BatchScheduler (stages.scheduler; docs/scheduler.md) with their frames' deadlines.
The scheduler hands out batches of exactly each model's export size (padded and masked),
closed when full or when the oldest job has waited the model's max_wait_ms, chosen by deadline
and device cost with per-camera fairness and a preference for models whose contexts are
resident; stale jobs are dropped and counted. The host glue of the next batch (each model's
runtime: crops, preprocessing) runs in one worker thread while the current batch runs on the
device in another (the only thread that touches the device, so XRT objects stay on one
thread). Each real slot leaves as an `Inferred` of its kind (its runtime's `inferred_type`:
PoseInferred, FaceInferred, ClipInferred) naming backend, model and whether the weights are
synthetic.

At shutdown (the inbox closed, the stage failed or was cancelled) batches not yet on the
device are cancelled, and the models and the device are closed on the device thread after
the pass in progress; the stage waits for that at most CLOSE_TIMEOUT_S. A device call still
running then is logged (model, cameras and frames of its batch) and left behind: the device
thread is a daemon, so it cannot keep the process from exiting. A failure to close is logged
naming the model or device and backend, counted (`close_errors`), and raised as
DeviceCloseError unless another exception is already ending the stage.

A device error, or a malformed pass report the scheduler refuses (wrong output count, bad
device time), fails that batch's jobs (dropped `error`, counted per model and camera) and
the stage goes on; running out of hardware contexts makes the device's LRU evict, not fail.
A dispatch past its deadline (npu.device.DeviceTimeout: the device parked its context and
reloaded the kernel) fails its batch's jobs as `device_timeout`; once the device is marked
failed every later batch fails the same way at once, and the stage goes on. When the stage
is cancelled its device's waits are interrupted, and a device with parked contexts is
closed without tearing down XRT (docs/inference.md, "Device waits").
Its scheduler and device numbers are registered as stage gauges (`<stage>` and
`<stage>/<model>`) with pipeline.metrics, so they are on the `stats` topic and Prometheus.
Configuration keys: docs/configuration.md ("infer stage"); design: docs/inference.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from npu import thread_priority
from npu.device import (
    DeviceFailed,
    DeviceTimeout,
)
from npu.models import ModelLoadError
from pipeline.config import Config
from pipeline.errors import NpucamError
from pipeline.graph import Stage
from pipeline.messages import now_ns
from pipeline.queues import Policy
from pipeline.startup import Startup
from stages.batches import Batch, ModelProfile, QueuedJob, SchedulerError
from stages.device_thread import DeviceThread, batch_name, run_prepared, steps_prepared
from stages.infer_options import InferOptions, check_infer, open_stage_device
from stages.infer_report import InferReport
from stages.jobs import Job
from stages.runtimes import Pacing, Runtime, open_runtime, resolve
from stages.scheduler import BatchScheduler

log = logging.getLogger(__name__)

ERROR_LOG_LINES = 5
# shutdown waits this long for the pass in progress and the closes (the pipeline gives a
# cancelled stage 2 s before it abandons it, and this wait should be the one that reports)
CLOSE_TIMEOUT_S = 1.5


class DeviceCloseError(NpucamError):
    """The models or the device could not be closed at shutdown, or the device thread was
    still busy when the shutdown stopped waiting for it."""


PACING_TEXT = {
    "npu2": "each pass takes the modelled NPU2 time of the released model it is or stands "
    "in for; docs/device.md",
    "stand-in": "each pass takes the modelled time of its own dispatches, not NPU2's",
    "none": "no waiting: passes run as fast as the host computes them",
}
SECOND_WARM_UP_S = 5.0  # a first pass shorter than this is followed by the measured one
PACED_OVERRUN = 1.25  # a paced first pass longer than this x its modelled time is re-measured


def _measured_cost(rt: Runtime) -> float:
    """A model's initial pass cost: its first pass pays one-time work (kernel and context
    loads, weight unpacking, caches, the host kernels' JIT compile on a fresh install), so
    when that pass is short a second one is measured. A pass paced as NPU2 takes its modelled
    time every time, so one pass is enough unless the one-time host work outlasted it (a
    9 s first Sapiens2 pass against its 2.4 s made the scheduler refuse every pose job)."""
    first = rt.warm_up()
    if rt.pacing.startswith("npu2"):
        modelled = getattr(rt.timer, "last_charge_s", 0.0)
        return first if first <= modelled * PACED_OVERRUN else rt.warm_up()
    if first >= SECOND_WARM_UP_S:
        return first
    return rt.warm_up()


class Infer(InferReport, Stage[InferOptions]):
    """The NPU stage (see the module docstring)."""

    kind = "infer"
    accepts = (Job,)  # each enabled model takes its runtime's job_type
    Options = InferOptions

    def __init__(self, name: str, options: InferOptions, context: Any) -> None:
        super().__init__(name, options, context)
        self.startup = Startup.of(context)
        self.startup.expect(name)  # the sources read once the models are loaded
        self.base_dir = Path(getattr(context.config, "base_dir", Path.cwd()))
        self.device: Any = None
        self.runtimes: dict[str, Runtime] = {}
        self.scheduler: BatchScheduler | None = None
        self.errors: Counter = Counter()  # model -> jobs failed (`error` or `device_timeout`)
        self.timeouts: Counter = Counter()  # model -> jobs failed with `device_timeout`
        self._failed_logged = False
        self.last_error: dict[str, str] = {}
        self.published: Counter = Counter()  # model -> results sent on
        self._mirrored: Counter = Counter()
        self.close_errors = 0  # models / device that failed to close, or a device thread hung
        self._device_thread: DeviceThread | None = None
        self._prep_pool: ThreadPoolExecutor | None = None
        # dispatched batches: the device thread's future and the loop's wrapper of it
        self._in_flight: deque[tuple[Batch, Future, asyncio.Future]] = deque()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set when jobs leave the model queues
        self._feeding = True
        self._inbox_blocks = False  # the stage's inbox is `block`: model queues default to it
        self._model_of: dict[type, str] = {}  # job type -> the enabled model that takes it

    @classmethod
    def check(cls, config: Config, index: int) -> list[str]:
        """Every enabled model's path for the backend exists, or synthetic is allowed; and
        each runtime's own checks of its table (stages.infer_options.check_infer)."""
        return check_infer(config, index)

    # -- startup (device thread) --------------------------------------------------------

    def _open(self) -> list[ModelProfile]:
        """Open the device, load every enabled model, measure a warm-up pass of each."""
        opts = self.options
        self.device = open_stage_device(opts, self.base_dir)
        pacing = Pacing(opts.sim.pacing, dict(opts.sim.pace_as))
        if opts.backend == "sim":
            log.info(
                "stage %s: sim device, pacing %s (%s)",
                self.name,
                pacing.mode,
                PACING_TEXT[pacing.mode],
            )
        profiles = []
        for name in opts.enabled():
            mo = opts.model(name)
            rt = open_runtime(
                name,
                opts.backend,
                mo.source(self.base_dir, f"stage {self.name}: {name}"),
                device=self.device,
                options=mo,
                base_dir=self.base_dir,
                synthetic_cache=resolve(self.base_dir, opts.synthetic_cache),
                pacing=pacing,
            )
            self.runtimes[name] = rt
            rt.attach(self.context)
            job_type = rt.job_type
            if job_type in self._model_of:
                raise ModelLoadError(
                    f"stage {self.name}: {name} and {self._model_of[job_type]} both take "
                    f"{job_type.__name__}; enable one of them"
                )
            self._model_of[job_type] = name
            cost = mo.cost_s if mo.cost_s is not None else max(_measured_cost(rt), 1e-4)
            log.info(
                "stage %s: %s on %s%s: model %s%s, export batch %d, %d contexts, "
                "pass cost %.4f s (%s)",
                self.name,
                name,
                opts.backend,
                f" (paced {rt.pacing})" if rt.pacing else "",
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
                    queue_policy=mo.policy(self._inbox_blocks),
                    share=mo.share,
                    interleave=rt.stepped,
                )
            )
        return profiles

    def _close(self) -> list[tuple[str, Exception]]:
        """Device thread: close every model's device resources, then the device, each even
        if another failed; the failures as (what, exception), each logged as it happens."""
        backend = self.options.backend
        failures = []
        parked = getattr(self.device, "parked_contexts", 0)
        if parked:
            log.warning(
                "stage %s: %d %s context(s) parked with hung dispatches: models not closed, "
                "the device closed without teardown",
                self.name,
                parked,
                backend,
            )
        for rt in [] if parked else self.runtimes.values():
            try:
                rt.close()
            except Exception as exc:
                log.exception("stage %s: closing %s on %s failed", self.name, rt.name, backend)
                failures.append((f"{rt.name} on {backend}", exc))
        if self.device is not None:
            try:
                self.device.close()
            except Exception as exc:
                log.exception("stage %s: closing the %s device failed", self.name, backend)
                failures.append((f"the {backend} device", exc))
        return failures

    # -- the run ------------------------------------------------------------------------

    async def run(self, inbox: Any, out: Any) -> None:
        self._device_thread = DeviceThread(f"{self.name}-device")
        self._prep_pool = ThreadPoolExecutor(
            1,
            thread_name_prefix=f"{self.name}-prepare",
            initializer=thread_priority.lower_this_thread,
        )
        feeder: asyncio.Task | None = None
        failure: BaseException | None = None
        self._inbox_blocks = getattr(inbox, "policy", None) is Policy.BLOCK
        try:
            opened = self._device_thread.submit("loading the models", self._open)
            try:
                profiles = await asyncio.wrap_future(opened)
            finally:
                self.startup.opened(self.name)
            self._device_thread.lower_priority()
            from npu.device import ctx_cache_cap

            # passes interleaved on the device thread: one more batch in flight, whose host
            # glue (the crop) is ready when the device thread can take it in
            stepped = any(p.interleave for p in profiles)
            interleave = self._device_thread.interleave if stepped else 1
            self.scheduler = BatchScheduler(
                profiles,
                context_slots=self.options.context_slots or ctx_cache_cap(),
                max_in_flight=interleave + 1,
                prepare_ahead_s=self.options.prepare_ahead_ms / 1000,
                model_window_s=self.options.model_window_s,
            )
            for model, rt in self.runtimes.items():  # a paced pass charges a modelled load
                if rt.timer.context_load_s is not None:
                    self.scheduler.observe_context_cost(model, rt.timer.context_load_s)
            self.metrics.add_gauges(self.name, self.device_gauges)
            self.metrics.add_info(self.name, self.device_info())
            for model, rt in self.runtimes.items():
                self.metrics.add_gauges(
                    f"{self.name}/{model}", functools.partial(self.model_gauges, model)
                )
                self.metrics.add_info(
                    f"{self.name}/{model}", {"model": rt.model_id, "pacing": rt.pacing}
                )
            feeder = asyncio.create_task(self._feed(inbox))
            await self._serve(out, feeder)
            await feeder  # re-raises a feeder failure
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if feeder is not None and not feeder.done():
                feeder.cancel()
            try:
                await self._shut_down(failure)
            finally:
                if self.scheduler is not None:
                    self._log_summary()

    async def _shut_down(self, failure: BaseException | None) -> None:
        """Cancel the batches not yet on the device, then close the models and the device on
        the device thread after the pass in progress, waiting at most CLOSE_TIMEOUT_S.
        Failures are logged and counted, and raised (DeviceCloseError) only when no other
        exception (`failure`) is ending the stage; a second cancel stops the wait."""
        device, prep = self._device_thread, self._prep_pool
        assert device is not None and prep is not None
        unrun = [batch for batch, ran, _ in self._in_flight if ran.cancel()]
        if unrun:
            log.warning(
                "stage %s: stopping: %d dispatched batch(es) not run: %s",
                self.name,
                len(unrun),
                "; ".join(batch_name(b) for b in unrun),
            )
        prep.shutdown(wait=False, cancel_futures=True)
        interrupt = getattr(self.device, "interrupt", None)
        if failure is not None and interrupt is not None:
            interrupt(f"stage {self.name} stopping")  # a pass waiting on the device ends now
        closed = device.submit("closing the models and the device", self._close)
        device.shutdown()
        waited = asyncio.wrap_future(closed)
        try:
            done, _ = await asyncio.wait({waited}, timeout=CLOSE_TIMEOUT_S)
        except asyncio.CancelledError:
            self._device_hung("cancelled again while waiting")
            if failure is None:
                raise
            return  # the exception already ending the stage goes on
        if not done:
            problem = self._device_hung(f"waited {CLOSE_TIMEOUT_S:g} s")
            if failure is None:
                raise DeviceCloseError(f"stage {self.name}: {problem}")
            return
        failures = waited.result()
        self.close_errors += len(failures)
        if failures and failure is None:
            what = "; ".join(f"{w}: {type(e).__name__}: {e}" for w, e in failures)
            raise DeviceCloseError(f"stage {self.name}: closing failed: {what}") from failures[0][1]

    def _device_hung(self, how: str) -> str:
        """Log and count a device thread still busy at shutdown; the message."""
        assert self._device_thread is not None
        self.close_errors += 1
        running = self._device_thread.running
        doing = (
            "about to close"
            if running is None
            else f"{running[0]}, running for {time.monotonic() - running[1]:.1f} s"
        )
        message = (
            f"the {self.options.backend} device thread did not finish ({how}): still {doing}; "
            "left running, models and device not closed"
        )
        log.error("stage %s: %s", self.name, message)
        return message

    async def _feed(self, inbox: Any) -> None:
        assert self.scheduler is not None
        try:
            async for item in inbox:
                await self._wait_for_room(type(item))
                self.submit(item)
        finally:
            self._feeding = False
            self._wake.set()

    async def _wait_for_room(self, kind: type) -> None:
        """Hold the job in hand while its model's `block` queue is full: the feeder takes
        nothing more from the inbox, so the inbox fills and its producers wait in turn."""
        assert self.scheduler is not None
        model = self._model_of.get(kind)
        if model is None or self.scheduler.profiles[model].queue_policy != "block":
            return
        while not self.scheduler.has_room(model):
            self._room.clear()
            await self._room.wait()

    def submit(self, item: Job) -> bool:
        """Queue one job for its model; False if dropped at once (counted)."""
        assert self.scheduler is not None
        model = self._model_of.get(type(item))
        if model is None:
            self.metrics.drop(f"{self.name}/unknown", item.camera, "error")
            self.errors["unknown"] += 1
            if self.errors["unknown"] <= ERROR_LOG_LINES:
                log.error(
                    "stage %s: camera %s: %s but no enabled model takes it; dropped",
                    self.name,
                    item.camera,
                    type(item).__name__,
                )
            return False
        rt = self.runtimes[model]
        # a keyed job supersedes its track's queued one (latest crop wins); a `block` queue
        # drops nothing, so there each job is its own
        block = self.scheduler.profiles[model].queue_policy == "block"
        ok = self.scheduler.submit(
            QueuedJob(
                model=model,
                camera=item.camera,
                payload=item,
                deadline_ns=item.deadline_ns,
                priority=rt.priority(item),
                key=None if block else rt.schedule_key(item),
                capture_ts_ns=item.capture_ts_ns,
                group=item.group,
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
        assert self._device_thread is not None
        in_flight = self._in_flight
        while True:
            while (batch := sched.next_batch()) is not None:
                rt = self.runtimes[batch.model]
                for job in batch.jobs:
                    wait_s = (batch.dispatch_ns - job.enqueue_ns) / 1e9
                    self.metrics.observe_queue_wait(f"{self.name}/{batch.model}", wait_s)
                glue = self._prep_pool.submit(rt.prepare, [job.payload for job in batch.jobs])
                if rt.stepped:
                    ran = self._device_thread.submit_steps(
                        batch_name(batch),
                        rt.name,
                        steps_prepared,
                        rt,
                        glue,
                        self.device,
                        ready=glue,
                    )
                else:
                    ran = self._device_thread.submit(
                        batch_name(batch), run_prepared, rt, glue, self.device
                    )
                in_flight.append((batch, ran, asyncio.wrap_future(ran)))
            self._sync_drops()
            self._room.set()  # dispatches and drops made room: a waiting feeder re-checks
            if in_flight and in_flight[0][2].done():
                batch, _, fut = in_flight.popleft()
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
                waits.add(in_flight[0][2])
            wake_ns = sched.wake_ns()
            timeout = None if wake_ns is None else max((wake_ns - now_ns()) / 1e9, 0.0) + 1e-4
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()

    def _failed(
        self, batch: Batch, exc: BaseException, device_s: float, finish_ns: int | None = None
    ) -> None:
        """A batch failed: its jobs dropped `device_timeout` (a dispatch past its deadline,
        or the device marked failed) or `error` (anything else)."""
        assert self.scheduler is not None
        timeout = isinstance(exc, DeviceTimeout)
        reason = "device_timeout" if timeout else "error"
        self.scheduler.fail(batch, device_s, finish_ns=finish_ns, reason=reason)
        self._sync_drops()
        if timeout:
            self.timeouts[batch.model] += len(batch.jobs)
        if isinstance(exc, DeviceFailed) and not self._failed_logged:
            self._failed_logged = True
            log.error(
                "stage %s: the %s device is marked failed; every job fails with "
                "device_timeout until npucam is restarted: %s",
                self.name,
                self.options.backend,
                exc,
            )
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
            ran, finish_ns, contexts = fut.result()
        except Exception as exc:
            self._failed(batch, exc, 0.0)
            return
        for model, share in contexts.items():  # measured context load costs, per model
            if model not in self.scheduler.profiles or share.load_cost_s is None:
                continue
            if self.runtimes[model].timer.context_load_s is None:  # else modelled, given at start
                self.scheduler.observe_context_cost(model, share.load_cost_s)
        try:
            returned = self.scheduler.complete(
                batch, ran.outputs, ran.device_s, finish_ns=finish_ns
            )
        except SchedulerError as exc:  # a malformed report: that batch fails, not the stage
            valid_s = ran.device_s if math.isfinite(ran.device_s) and ran.device_s >= 0 else 0.0
            self._failed(batch, exc, valid_s, finish_ns)
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
            rt.finish(job, slot)
            self.published[batch.model] += 1
            await out.send(
                rt.inferred_type(
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
