"""The NPU stage's batching scheduler: per-model queues -> fixed-size batches, chosen by cost.

Pure, deterministic logic with an injectable clock (ns, the clock of `deadline_ns`); no
device, no asyncio. It packs jobs into batches of exactly each model's export size (Triton's
"size or max delay" rule, with padded slots masked), budgets the one device by estimated
device-seconds (not job count), keeps per-camera fairness (virtual-time fair queueing over
device-seconds), prefers models whose hardware contexts are resident in a 16-slot LRU (each
context counted against its model, at the load cost measured per model) unless that would
break a deadline, and drops work that is stale or can no longer finish in time even on an
optimistic cost. Pass costs are learned from measured passes (stages/pass_costs.py); an
estimate that alone keeps a model's jobs from running relaxes toward the profile cost until
it runs again.
Design and the overlap protocol: docs/scheduler.md.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from pipeline.messages import now_ns
from pipeline.queues import oldest_of_busiest_camera
from stages.batches import DROP_REASONS, Batch, ModelProfile, QueuedJob, SchedulerError
from stages.context_lru import CONTEXT_LOAD_S, NPU2_CONTEXT_SLOTS, ContextLRU, ContextShare
from stages.pass_costs import PassCosts
from stages.scheduler_stats import ModelStats, SchedulerStats

_NS = 1_000_000_000


@dataclass(slots=True)
class _Candidate:
    profile: ModelProfile
    jobs: list[QueuedJob]
    switch_s: float
    cost_s: float
    bound_s: float
    finish_ns: int  # with the cost bound
    min_deadline_ns: int
    lead_served: float
    model_served: float
    continues_group: bool  # holds a job of a group already started


MAX_GROUPS = 256  # groups whose priority and start the scheduler remembers


class BatchScheduler:
    """Per-model bounded queues -> batches of exactly the export size, one device.

    Protocol (docs/scheduler.md): `submit` jobs as they arrive; call `next_batch` on every
    submit and complete and at `wake_ns()`. While a batch runs, `next_batch` hands out the
    next one once the device is within `prepare_ahead_s` of finishing (None: at once), up to
    `max_in_flight` outstanding, so the host glue of the next batch overlaps the device run
    of the current one. Run batches in dispatch order and report each with `complete`
    (outputs per slot, measured device time) or `fail`; only what `complete` returns may be
    published.

    Fairness, cost, residency (docs/scheduler.md): cameras and models are each charged the
    estimated device-seconds of their work (camera: per real slot / weight; model: per pass
    / share); a batch is eligible only if its camera is within `fairness_window_s` and its
    model within `model_window_s` of the least-served; among eligible batches a model with
    resident contexts goes first unless that makes another batch miss a deadline it could meet.
    """

    def __init__(
        self,
        profiles: Iterable[ModelProfile],
        *,
        clock: Callable[[], int] = now_ns,
        context_slots: int = NPU2_CONTEXT_SLOTS,
        context_load_s: float = CONTEXT_LOAD_S,
        cost_alpha: float = 0.2,
        fairness_window_s: float | None = None,
        model_window_s: float | None = None,
        camera_weights: dict[str, float] | None = None,
        prefer_resident: bool = True,
        max_in_flight: int = 2,
        prepare_ahead_s: float | None = 0.05,
        margin_devs: float = 2.0,
        recovery_half_life_s: float = 5.0,
    ) -> None:
        self.profiles: dict[str, ModelProfile] = {}
        for profile in profiles:
            if profile.name in self.profiles:
                raise SchedulerError(f"model profile {profile.name!r}: declared twice")
            if len(profile.contexts) > context_slots:
                raise SchedulerError(
                    f"model profile {profile.name!r}: field 'contexts' needs "
                    f"{len(profile.contexts)} contexts, the device holds {context_slots}"
                )
            self.profiles[profile.name] = profile
        if not self.profiles:
            raise SchedulerError("scheduler: no model profiles")
        self.costs = PassCosts(self.profiles, cost_alpha, margin_devs, recovery_half_life_s)
        if max_in_flight < 1:
            raise SchedulerError(f"scheduler: max_in_flight must be >= 1, got {max_in_flight}")
        for name, value in (
            ("fairness_window_s", fairness_window_s),
            ("model_window_s", model_window_s),
            ("prepare_ahead_s", prepare_ahead_s),
            ("context_load_s", context_load_s),
        ):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise SchedulerError(f"scheduler: {name} must be finite and >= 0, got {value}")
        for camera, weight in (camera_weights or {}).items():
            if not weight > 0:
                raise SchedulerError(f"camera {camera!r}: weight must be > 0, got {weight}")
        self.clock = clock
        self.context_load_s = context_load_s
        self.fairness_window_s = (
            max(p.cost_s for p in self.profiles.values())
            if fairness_window_s is None
            else fairness_window_s
        )
        # Half the cheapest pass (per share): models take turns by share within a pass, so
        # a minute's rates follow the shares; residency only orders the near-ties. A wider
        # window saves context loads but runs models in streaks of that many device-seconds.
        self.model_window_s = (
            min(p.cost_s / p.share for p in self.profiles.values()) / 2
            if model_window_s is None
            else model_window_s
        )
        self.camera_weights = dict(camera_weights or {})
        self.prefer_resident = prefer_resident
        self.max_in_flight = max_in_flight
        self.lru = ContextLRU(context_slots)
        self._context_cost: dict[str, float] = {}
        self._queues: dict[str, list[QueuedJob]] = {name: [] for name in self.profiles}
        self._blocked: set[str] = set()
        self._relaxed_ns = clock()
        self.prepare_ahead_ns = None if prepare_ahead_s is None else _s_to_ns(prepare_ahead_s)
        self._served: dict[str, float] = {}  # device-seconds charged per camera, / weight
        self._virtual = 0.0  # the charge level at which the latest batch started
        self._model_served: dict[str, float] = dict.fromkeys(self.profiles, 0.0)
        self._model_virtual = 0.0
        self._in_flight: list[Batch] = []
        self._head_start_ns = 0  # when the first batch in flight started (or starts)
        # group -> its shared priority; and the groups with a job dispatched, newest last
        self._group_priority: OrderedDict[Hashable, int] = OrderedDict()
        self._started_groups: OrderedDict[Hashable, None] = OrderedDict()
        self._seq = 0
        self.stats = SchedulerStats(started_ns=clock())
        for name, p in self.profiles.items():
            self.stats.models[name] = ModelStats(cost_estimate_s=p.cost_s)

    # -- intake ---------------------------------------------------------------------------

    def submit(self, job: QueuedJob) -> bool:
        """Queue a job; False if it was dropped at once (counted: stale or queue_full)."""
        profile = self.profiles.get(job.model)
        if profile is None:
            raise SchedulerError(
                f"camera {job.camera!r}: job for unknown model {job.model!r} "
                f"(known: {sorted(self.profiles)})"
            )
        now = self.clock()
        if now > job.deadline_ns:
            self._drop(job, "stale")
            return False
        queue = self._queues[job.model]
        if job.group is not None:
            self._share_priority(job, queue)
        if job.key is not None:
            ts = job.capture_ts_ns
            same = [queued for queued in queue if queued.key == job.key]
            if ts is not None and any(
                q.capture_ts_ns is not None and q.capture_ts_ns > ts for q in same
            ):
                self._replaced(job)  # a later frame of its key is queued already
                return False
            # Jobs of an earlier frame (or of an unknown one) are superseded; jobs of the same
            # frame are distinct items and stay.
            superseded = [
                q for q in same if ts is None or q.capture_ts_ns is None or q.capture_ts_ns < ts
            ]
            if superseded:
                # The first keeps its place and enqueue time (a track refreshed every frame
                # still reaches max_wait); the others leave the queue.
                first = superseded[0]
                for queued in superseded:
                    self._replaced(queued)
                    if queued is not first:
                        queue.remove(queued)
                first.payload = job.payload
                first.deadline_ns = job.deadline_ns
                first.priority = job.priority
                first.capture_ts_ns = job.capture_ts_ns
                first.group = job.group
                return True
        if len(queue) >= profile.queue_size:
            if profile.queue_policy == "block":
                raise SchedulerError(
                    f"camera {job.camera!r}: the {job.model} queue is full ({len(queue)} "
                    "jobs) and its policy is block: wait for has_room() before submitting"
                )
            if profile.queue_policy == "reject_new":
                self._drop(job, "queue_full")
                return False
            self._drop_oldest_of_largest_camera(queue)
        self._lift_returning_camera(job.camera)
        if not queue:
            served = self._model_served[job.model]
            self._model_served[job.model] = max(served, self._model_virtual)
        job.enqueue_ns = now
        queue.append(job)
        return True

    def _share_priority(self, job: QueuedJob, queue: list[QueuedJob]) -> None:
        """A group's jobs all take the lowest priority any of them came with."""
        shared = min(self._group_priority.get(job.group, job.priority), job.priority)
        self._group_priority[job.group] = shared
        self._group_priority.move_to_end(job.group)
        while len(self._group_priority) > MAX_GROUPS:
            self._group_priority.popitem(last=False)
        job.priority = shared
        for queued in queue:
            if queued.group == job.group:
                queued.priority = shared

    def _replaced(self, job: QueuedJob) -> None:
        # Its result will never come: counted per camera like every drop (queue_full, as a
        # `latest` queue counts the item a newer one replaces), and as `replaced`.
        self.stats.models[job.model].replaced += 1
        self._drop(job, "queue_full")

    def _drop_oldest_of_largest_camera(self, queue: list[QueuedJob]) -> None:
        victim = queue.pop(
            oldest_of_busiest_camera(queue, lambda j: j.camera, lambda j: j.enqueue_ns)
        )
        self._drop(victim, "queue_full")

    def _lift_returning_camera(self, camera: str) -> None:
        # A camera that had nothing queued does not bank credit for its idle time: it rejoins
        # at the virtual time of the latest dispatch (start-time fair queueing).
        if any(job.camera == camera for queue in self._queues.values() for job in queue):
            return
        self._served[camera] = max(self._served.get(camera, 0.0), self._virtual)

    # -- dispatch -------------------------------------------------------------------------

    def has_room(self, model: str) -> bool:
        """Whether `model`'s queue is below its bound (a `block` queue takes a job only then)."""
        return len(self._queues[model]) < self.profiles[model].queue_size

    def pending(self, model: str | None = None) -> int:
        """Queued (not dispatched) jobs, of one model or of all."""
        if model is not None:
            return len(self._queues[model])
        return sum(len(q) for q in self._queues.values())

    @property
    def in_flight(self) -> tuple[Batch, ...]:
        """Dispatched batches not yet reported, in dispatch order."""
        return tuple(self._in_flight)

    def cost_estimate_s(self, model: str) -> float:
        """Current device-time estimate of one batch of `model` (contexts resident)."""
        return self.costs.estimate_s[model]

    def cost_bound_s(self, model: str) -> float:
        """The cost deadlines are judged on: estimate + margin_devs x mean abs deviation."""
        return self.costs.bound_s(model)

    def cost_floor_s(self, model: str) -> float:
        """The optimistic pass cost `npu_busy` drops are judged on: the lower of the estimate
        and the profile's cost (a pass that once took that long may again)."""
        return self.costs.floor_s(model)

    def wake_ns(self) -> int | None:
        """When to call `next_batch` again if nothing arrives or completes first: the next
        partial batch's max-wait close, or the prepare-ahead point of the last batch in flight
        (None if no job is queued, or if max_in_flight batches are in flight: only a
        completion can change that). While a batch is in flight, only jobs expected to finish
        in time count (the others wait for the device to be idle: its completion wakes)."""
        if len(self._in_flight) >= self.max_in_flight:
            return None
        now = self.clock()
        start_ns = self._device_free_ns(now)
        latest_start_ns = self._device_free_ns(now, bound=True)
        times = []
        for name, queue in self._queues.items():
            if self._in_flight:
                queue = self._sort_out(name, now, start_ns, latest_start_ns)[0]
            if not queue:
                continue
            profile = self.profiles[name]
            oldest = min(job.enqueue_ns for job in queue)
            full = len(queue) >= profile.batch_size
            times.append(oldest + (0 if full else _ms_to_ns(profile.max_wait_ms)))
        if times and self._in_flight and self.prepare_ahead_ns is not None:
            prepare_at = start_ns - self.prepare_ahead_ns
            times = [max(t, prepare_at) for t in times]
        return min(times, default=None)

    def next_batch(self) -> Batch | None:
        """The batch the device should run next, or None (nothing ready, or enough in flight).

        Drops queued jobs that are stale or cannot finish before their deadline even if
        their batch started when the device is expected to free up and took the optimistic
        cost (`cost_floor_s`); then, among models with a ready batch (full, or its oldest job
        waited max_wait_ms) of jobs expected to finish in time by the cost bound, picks by
        camera fairness, residency and deadline. With no such batch and the device idle, it
        runs a ready batch of jobs that may still finish (and so re-measures its model).
        """
        now = self.clock()
        start_ns = self._device_free_ns(now)
        latest_start_ns = self._device_free_ns(now, bound=True)
        self._relax(now)
        safe: dict[str, list[QueuedJob]] = {}
        self._blocked = set()
        for name in self._queues:
            safe[name], at_risk = self._sort_out(name, now, start_ns, latest_start_ns, drop=True)
            # blocked by its own estimate: no job it would run, and its bound outlasts the time
            # left of its freshest job even on an idle device
            bound_ns = _s_to_ns(self._switch_s(self.profiles[name]) + self.cost_bound_s(name))
            if (
                at_risk
                and not safe[name]
                and now + bound_ns > max(job.deadline_ns for job in at_risk)
            ):
                self._blocked.add(name)
        if len(self._in_flight) >= self.max_in_flight:
            return None
        # Decide as late as the host glue allows: fresher jobs, fuller batches; but a pass
        # that interleaves with the ones in flight must be there to interleave with them.
        early = (
            self._in_flight
            and self.prepare_ahead_ns is not None
            and start_ns - now > self.prepare_ahead_ns
        )
        if early and not all(self.profiles[b.model].interleave for b in self._in_flight):
            return None
        candidates = [
            self._candidate(self.profiles[name], latest_start_ns, jobs)
            for name, jobs in safe.items()
            if jobs and self._ready(name, jobs, now)
        ]
        if not candidates and not self._in_flight:
            # The device is idle and nothing is expected to finish in time: run what might.
            candidates = [
                self._candidate(self.profiles[name], latest_start_ns, queue)
                for name, queue in self._queues.items()
                if queue and self._ready(name, queue, now)
            ]
        if not candidates:
            return None
        chosen = self._choose(candidates, latest_start_ns)
        if early and not chosen.profile.interleave:
            return None  # its turn comes at the prepare-ahead point
        return self._dispatch(chosen, now, start_ns)

    def _device_free_ns(self, now: int, bound: bool = False) -> int:
        """When the batches in flight will have run, by the cost estimates (or bounds)."""
        if not self._in_flight:
            return now
        t = self._head_start_ns
        for b in self._in_flight:
            t += _s_to_ns(b.switch_s + (b.cost_bound_s if bound else b.cost_s))
        return max(t, now)

    def _ready(self, model: str, jobs: list[QueuedJob], now: int) -> bool:
        profile = self.profiles[model]
        oldest = min(job.enqueue_ns for job in jobs)
        return len(jobs) >= profile.batch_size or now - oldest >= _ms_to_ns(profile.max_wait_ms)

    def _switch_s(self, profile: ModelProfile, after: Iterable[str] = ()) -> float:
        return self.lru.missing(profile.contexts, after) * self.load_cost_s(profile.name)

    def load_cost_s(self, model: str) -> float:
        """Seconds one context load of `model` costs: measured once observed, else the default."""
        return self._context_cost.get(model, self.context_load_s)

    def observe_context_cost(self, model: str, seconds: float) -> None:
        """The device's measured cost of one of `model`'s context loads (its per-model view,
        npu.device.ModelContexts.load_cost_s); used from then on for its switch costs."""
        if model not in self.profiles:
            raise SchedulerError(f"model {model!r}: no such model profile")
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise SchedulerError(f"model {model!r}: context load cost {seconds!r} is invalid")
        self._context_cost[model] = seconds

    def context_view(self) -> dict[str, ContextShare]:
        """Each model's share of the modelled context budget: what it needs, what of it is
        resident, what it loaded, who evicted its contexts, and at what cost a load comes."""
        out = {}
        for name, profile in self.profiles.items():
            out[name] = ContextShare(
                contexts=profile.contexts,
                resident=self.lru.resident_of(name),
                loads=self.lru.loads_by[name],
                evicted={by: n for (own, by), n in self.lru.evicted.items() if own == name},
                load_s=self.load_cost_s(name),
                measured=name in self._context_cost,
            )
        return out

    def _sort_out(
        self, name: str, now: int, start_ns: int, latest_start_ns: int, drop: bool = False
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        """Split `name`'s queue into (safe, at risk): safe jobs finish in time if their batch
        starts when the device frees up by the bounds and takes the cost bound; jobs at risk
        would with the expected start and the optimistic cost. With drop=True the rest are
        dropped (`stale` or `npu_busy`) and the queue keeps safe and at-risk jobs."""
        queue = self._queues[name]
        if not queue:
            return [], []
        switch_s = self._switch_s(self.profiles[name])
        bound_finish = latest_start_ns + _s_to_ns(switch_s + self.cost_bound_s(name))
        idle_ns = _s_to_ns(switch_s + self.cost_floor_s(name))
        floor_finish = start_ns + idle_ns
        safe: list[QueuedJob] = []
        at_risk: list[QueuedJob] = []
        for job in queue:
            if now > job.deadline_ns or floor_finish > job.deadline_ns:
                if drop:
                    self._drop(job, "stale" if now > job.deadline_ns else "npu_busy")
                    if now <= job.deadline_ns < now + idle_ns:  # late even if started now
                        self.costs.refuse(name)
            elif bound_finish > job.deadline_ns:
                at_risk.append(job)
            else:
                safe.append(job)
        if drop:
            kept = {id(job) for job in safe + at_risk}
            queue[:] = [job for job in queue if id(job) in kept]
        return safe, at_risk

    def _relax(self, now: int) -> None:
        """Relax the models blocked by their own cost bound since the last call, or refused
        before any pass measured them, with no pass in flight (PassCosts.relax)."""
        elapsed_ns = now - self._relaxed_ns
        self._relaxed_ns = now
        if elapsed_ns <= 0 or not (self._blocked or self.costs.refused):
            return
        relaxed = (self._blocked | self.costs.refused) - {b.model for b in self._in_flight}
        self.costs.relax(relaxed, elapsed_ns)
        for name in relaxed:
            self.stats.models[name].cost_estimate_s = self.costs.estimate_s[name]

    def _weight(self, camera: str) -> float:
        return self.camera_weights.get(camera, 1.0)

    def _candidate(
        self, profile: ModelProfile, latest_start_ns: int, queued: list[QueuedJob]
    ) -> _Candidate:
        """The batch this model would run now from `queued`: jobs taken camera by camera,
        least served camera first (charging each taken job its share of the batch cost), and
        within a camera by (priority, deadline, arrival). A job of a group already started
        goes first: in its camera, and across cameras among those within the fairness window
        of the least served."""
        cost = self.costs.estimate_s[profile.name]
        switch = self._switch_s(profile)
        started = self._started_groups
        by_camera: dict[str, list[QueuedJob]] = {}
        for job in sorted(
            queued,
            key=lambda j: (j.group not in started, j.priority, j.deadline_ns, j.enqueue_ns),
        ):
            by_camera.setdefault(job.camera, []).append(job)
        served = {c: self._served.get(c, 0.0) for c in by_camera}
        lead = min(served.values())
        share = cost / profile.batch_size
        jobs: list[QueuedJob] = []
        while len(jobs) < profile.batch_size and by_camera:
            floor = min(served[c] for c in by_camera)
            camera = min(
                by_camera,
                key=lambda c: (
                    not (
                        by_camera[c][0].group in started
                        and served[c] <= floor + self.fairness_window_s
                    ),
                    served[c],
                    c,
                ),
            )
            jobs.append(by_camera[camera].pop(0))
            if not by_camera[camera]:
                del by_camera[camera]
            served[camera] += share / self._weight(camera)
        return _Candidate(
            profile=profile,
            jobs=jobs,
            switch_s=switch,
            cost_s=cost,
            bound_s=self.cost_bound_s(profile.name),
            finish_ns=latest_start_ns + _s_to_ns(switch + self.cost_bound_s(profile.name)),
            min_deadline_ns=min(job.deadline_ns for job in jobs),
            lead_served=lead,
            model_served=self._model_served[profile.name],
            continues_group=any(j.group in started for j in jobs),
        )

    def _choose(self, candidates: list[_Candidate], latest_start_ns: int) -> _Candidate:
        # Fairness first, in two windows of device-seconds: cameras, then models. Within
        # them the order is free, so a resident model runs until its model (or camera) is
        # a window ahead of the others: no model starves behind a resident one.
        floor = min(c.lead_served for c in candidates)
        eligible = [c for c in candidates if c.lead_served <= floor + self.fairness_window_s]
        floor = min(c.model_served for c in eligible)
        eligible = [c for c in eligible if c.model_served <= floor + self.model_window_s]
        if not self.prefer_resident:
            return min(
                eligible,
                key=lambda c: (
                    not c.continues_group,
                    c.lead_served,
                    c.model_served,
                    c.min_deadline_ns,
                    c.profile.name,
                ),
            )
        best = min(
            eligible,
            key=lambda c: (
                not c.continues_group,
                c.switch_s > 0,
                c.lead_served,
                c.model_served,
                c.min_deadline_ns,
                c.profile.name,
            ),
        )
        # Residency must not break a deadline: if running `best` first makes another batch
        # miss a deadline it can still meet, and running that batch first keeps `best` within
        # its own, run the most urgent such batch first. When one of the two misses either
        # way, `best` stays (no context switch spent on it).
        best_total = best.switch_s + best.bound_s
        threatened = []
        for c in eligible:
            if c is best or c.finish_ns > c.min_deadline_ns:
                continue
            c_after = best_total + self._switch_s(c.profile, best.profile.contexts) + c.bound_s
            best_after = c.switch_s + c.bound_s + self._switch_s(best.profile, c.profile.contexts)
            if (
                latest_start_ns + _s_to_ns(c_after) > c.min_deadline_ns
                and latest_start_ns + _s_to_ns(best_after + best.bound_s) <= best.min_deadline_ns
            ):
                threatened.append(c)
        if threatened:
            return min(threatened, key=lambda c: (c.min_deadline_ns, c.profile.name))
        return best

    def _dispatch(self, chosen: _Candidate, now: int, start_ns: int) -> Batch:
        profile = chosen.profile
        taken = {id(job) for job in chosen.jobs}
        queue = self._queues[profile.name]
        queue[:] = [job for job in queue if id(job) not in taken]
        loads, evictions = self.lru.use(profile.contexts, profile.name)
        switch_s = len(loads) * self.load_cost_s(profile.name)
        self.stats.context_loads += len(loads)
        self.stats.context_evictions += len(evictions)
        stats = self.stats.models[profile.name]
        stats.batches += 1
        stats.slots += profile.batch_size
        stats.filled += len(chosen.jobs)
        padded = profile.batch_size - len(chosen.jobs)
        stats.padding_waste_s += (switch_s + chosen.cost_s) * padded / profile.batch_size
        # Fairness charges the estimated device cost, not the context switch: the switch
        # follows from the scheduler's order, not from the camera's or the model's work.
        # A model pays for its whole pass; a camera for its jobs' slots.
        self._virtual = max(self._virtual, chosen.lead_served)
        self._model_virtual = max(self._model_virtual, chosen.model_served)
        self._model_served[profile.name] += chosen.cost_s / profile.share
        for job in chosen.jobs:
            if job.group is not None:
                self._started_groups[job.group] = None
                while len(self._started_groups) > MAX_GROUPS:
                    self._started_groups.popitem(last=False)
            charge = chosen.cost_s / profile.batch_size / self._weight(job.camera)
            self._served[job.camera] = self._served.get(job.camera, 0.0) + charge
            wait = (now - job.enqueue_ns) / _NS
            stats.wait_s_sum += wait
            stats.wait_s_max = max(stats.wait_s_max, wait)
            stats.waits += 1
        self._seq += 1
        batch = Batch(
            seq=self._seq,
            model=profile.name,
            size=profile.batch_size,
            jobs=tuple(chosen.jobs),
            loads=loads,
            evictions=evictions,
            switch_s=switch_s,
            cost_s=chosen.cost_s,
            cost_bound_s=chosen.bound_s,
            dispatch_ns=now,
            est_start_ns=start_ns,
            est_finish_ns=start_ns + _s_to_ns(switch_s + chosen.cost_s),
        )
        if not self._in_flight:
            self._head_start_ns = now
        self._in_flight.append(batch)
        return batch

    # -- results --------------------------------------------------------------------------

    def complete(
        self,
        batch: Batch,
        outputs: Sequence[Any],
        device_s: float,
        finish_ns: int | None = None,
    ) -> list[tuple]:
        """Report a finished batch: one output per slot and its measured device time (s,
        context loads included). Returns [(job, output)] for the real jobs still within their
        deadline; padded slots are discarded and late results are counted as `stale` drops.
        finish_ns: when the device finished the pass, on the scheduler's clock (None: now);
        the next batch in flight started then (or when it was dispatched, if later), however
        late this report is handled. A malformed report raises and leaves the batch in
        flight (report it with `fail`)."""
        self._check_order(batch)
        if len(outputs) != batch.size:
            raise SchedulerError(
                f"model {batch.model!r}: batch {batch.seq} has {batch.size} slots, "
                f"got {len(outputs)} outputs"
            )
        if not (device_s >= 0 and math.isfinite(device_s)):
            raise SchedulerError(
                f"model {batch.model!r}: batch {batch.seq} device time {device_s!r} is invalid"
            )
        if finish_ns is not None and not _is_int(finish_ns):
            raise SchedulerError(
                f"model {batch.model!r}: batch {batch.seq} finish_ns {finish_ns!r} is not an "
                "int (ns on the scheduler's clock)"
            )
        self._retire(batch, finish_ns)
        self.stats.busy_s += device_s
        cost = self.costs.observe(batch.model, max(device_s - batch.switch_s, 0.0))
        self.stats.models[batch.model].cost_estimate_s = cost
        now = self.clock()
        out: list[tuple] = []
        for job, output in zip(batch.jobs, outputs, strict=False):
            if now > job.deadline_ns:
                self._drop(job, "stale")
                continue
            out.append((job, output))
            self.stats.results[(job.model, job.camera)] += 1
            self.stats.models[job.model].results += 1
        return out

    def fail(
        self,
        batch: Batch,
        device_s: float = 0.0,
        finish_ns: int | None = None,
        reason: str = "error",
    ) -> None:
        """Report a batch whose device run failed: its jobs are dropped with `reason`
        (`error`, or `device_timeout` for a dispatch past its deadline). finish_ns: when the
        device gave up on it, as in `complete` (None, or not an int: now)."""
        if reason not in DROP_REASONS:
            raise SchedulerError(f"drop reason {reason!r} is not one of {DROP_REASONS}")
        self._retire(batch, finish_ns if _is_int(finish_ns) else None)
        self.stats.busy_s += max(device_s, 0.0)
        for job in batch.jobs:
            self._drop(job, reason)

    def _check_order(self, batch: Batch) -> None:
        if not self._in_flight or self._in_flight[0] is not batch:
            expected = self._in_flight[0].seq if self._in_flight else None
            raise SchedulerError(
                f"model {batch.model!r}: batch {batch.seq} reported out of order or twice "
                f"(expected batch {expected})"
            )

    def _retire(self, batch: Batch, finish_ns: int | None) -> None:
        """Take the head batch out of flight. The next one starts on the device when this
        one ends (the device thread runs it without waiting for the event loop), and not
        before its dispatch (its host glue starts then). A report handled late must not
        shift that start: the device was busy with the next batch meanwhile."""
        self._check_order(batch)
        self._in_flight.pop(0)
        now = self.clock()
        # a pass ends after it started and no later than its report (a clock step, a skew)
        end = now if finish_ns is None else min(max(int(finish_ns), self._head_start_ns), now)
        if self._in_flight:
            end = max(end, self._in_flight[0].dispatch_ns)
        self._head_start_ns = end

    def _drop(self, job: QueuedJob, reason: str) -> None:
        self.stats.drops[(job.model, job.camera, reason)] += 1


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _ms_to_ns(ms: float) -> int:
    return round(ms * 1_000_000)


def _s_to_ns(s: float) -> int:
    return round(s * _NS)
