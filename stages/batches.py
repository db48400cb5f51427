"""What the NPU stage's batching scheduler (stages/scheduler.py) takes and hands out: a model's
profile, a queued job, a batch of the export size, the queue policies and drop reasons."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.errors import NpucamError

QueuePolicy = Literal["drop_oldest", "reject_new", "block"]
QUEUE_POLICIES: tuple[str, ...] = ("drop_oldest", "reject_new", "block")

# Why a job was dropped: past its deadline; still in time but unable to finish before it
# even on an optimistic cost (the device's backlog, or a pass longer than the time left);
# its model's queue was full or a later frame's job of its key superseded it; its device
# run failed; one of its device dispatches passed its deadline.
DROP_REASONS: tuple[str, ...] = ("stale", "npu_busy", "queue_full", "error", "device_timeout")


class SchedulerError(NpucamError):
    """A model profile, job or batch report the scheduler cannot accept."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What the scheduler needs to know about one loaded model.

    batch_size: the export batch size from its bundle (items per device pass).
    max_wait_ms: a partial batch closes once its oldest job has waited this long.
    contexts: the hardware-context keys its kernels need (shared keys are shared contexts).
    cost_s: initial estimate of one batch's device time with its contexts resident.
    queue_size / queue_policy: the bound of its queue and what happens when it is full:
        drop the oldest job of the busiest camera, refuse the new job, or ("block") nothing
        is dropped because the submitter waits for `has_room` first (stages/infer.py).
    share: its weight in the device-time split between models that all have work.
    interleave: its passes run interleaved on the device thread (the host glue of one while
        the device runs the other's dispatches), so while only such passes are in flight
        its next batch is handed out at once, not `prepare_ahead_s` before the device frees.
    """

    name: str
    batch_size: int
    max_wait_ms: float
    contexts: tuple[str, ...]
    cost_s: float
    queue_size: int = 64
    queue_policy: QueuePolicy = "drop_oldest"
    share: float = 1.0
    interleave: bool = False

    def __post_init__(self) -> None:
        where = f"model profile {self.name!r}"
        if not self.name:
            raise SchedulerError("model profile: field 'name' is empty")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise SchedulerError(f"{where}: field 'batch_size' must be an int >= 1")
        if not (self.max_wait_ms >= 0 and math.isfinite(self.max_wait_ms)):
            raise SchedulerError(f"{where}: field 'max_wait_ms' must be finite and >= 0")
        if not (self.cost_s > 0 and math.isfinite(self.cost_s)):
            raise SchedulerError(f"{where}: field 'cost_s' must be finite and > 0")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise SchedulerError(f"{where}: field 'share' must be finite and > 0")
        if not isinstance(self.queue_size, int) or self.queue_size < 1:
            raise SchedulerError(f"{where}: field 'queue_size' must be an int >= 1")
        if self.queue_policy not in QUEUE_POLICIES:
            raise SchedulerError(
                f"{where}: field 'queue_policy' is {self.queue_policy!r}, "
                f"expected one of {QUEUE_POLICIES}"
            )
        if isinstance(self.contexts, str) or len(set(self.contexts)) != len(self.contexts):
            raise SchedulerError(f"{where}: field 'contexts' must be a tuple of distinct keys")


@dataclass(slots=True, eq=False)
class QueuedJob:
    """One unit of work for one model.

    deadline_ns: capture_ts + the staleness budget; no result is returned after it.
    priority: lower runs first within a camera (e.g. the ns time a track's pose was last
        refreshed, so the oldest pose goes first); ties go to the earliest deadline.
    key: optional identity (e.g. (camera, track_id, source)); a job from a later frame
        supersedes the queued jobs of its key (latest crop wins), jobs of one frame never
        replace each other (two faces in one person box). Superseded jobs are dropped
        `queue_full`, as a `latest` queue drops the item a newer one replaces.
    capture_ts_ns: the capture time of the job's frame, which orders jobs of one key; None
        (unknown): the newer submission supersedes.
    group: optional; jobs of one group (a rig's views of one instant) share one priority (the
        lowest of theirs) and, once one of them has been dispatched, the rest go first
        wherever fairness allows, so they run back to back.
    enqueue_ns: set by `submit`.
    """

    model: str
    camera: str
    payload: Any
    deadline_ns: int
    priority: int = 0
    key: Hashable | None = None
    capture_ts_ns: int | None = None
    group: Hashable | None = None
    enqueue_ns: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch handed to the device: `size` slots, the first len(jobs) real, the rest padding.

    The stage fills padded slots with any valid input (e.g. a copy of the first item); their
    outputs are discarded by `BatchScheduler.complete`. loads/evictions are the contexts the
    LRU model loads and evicts for this batch, in order; switch_s is their modelled time.
    """

    seq: int
    model: str
    size: int
    jobs: tuple[QueuedJob, ...]
    loads: tuple[str, ...]
    evictions: tuple[str, ...]
    switch_s: float
    cost_s: float
    cost_bound_s: float
    dispatch_ns: int
    est_start_ns: int
    est_finish_ns: int

    @property
    def padded(self) -> int:
        """Number of padded slots."""
        return self.size - len(self.jobs)

    @property
    def mask(self) -> tuple[bool, ...]:
        """Per slot: True for a real job, False for padding."""
        return (True,) * len(self.jobs) + (False,) * self.padded

    def slot_payloads(self) -> list[Any]:
        """The payload of every slot; padded slots repeat the first real payload."""
        payloads = [job.payload for job in self.jobs]
        return payloads + [payloads[0]] * self.padded
