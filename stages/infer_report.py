"""What an infer stage reports: its scheduler and device numbers as JSON-able stats, and the
gauges it registers with pipeline.metrics (`<stage>` and `<stage>/<model>`, on the `stats`
topic and Prometheus; docs/scheduler.md names them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from pipeline.messages import now_ns
from stages.infer_options import InferOptions
from stages.runtimes import Runtime
from stages.scheduler import BatchScheduler


class InferReport:
    """The infer stage's reporting half (stages.infer.Infer holds the state it reads)."""

    options: InferOptions
    scheduler: BatchScheduler | None
    runtimes: dict[str, Runtime]
    device: Any
    published: Counter
    errors: Counter
    timeouts: Counter
    last_error: dict[str, str]
    close_errors: int

    def stats(self) -> dict:
        """The stage's scheduler and device numbers as JSON-able data (scheduler metrics of
        docs/scheduler.md, plus per model its backend, model id, synthetic flag and errors)."""
        assert self.scheduler is not None
        snap = self.scheduler.stats.snapshot(now_ns())
        snap.update(self.device_info())
        snap["close_errors"] = self.close_errors
        snap["runtimes"] = {
            name: {
                "model": rt.model_id,
                "synthetic": rt.synthetic,
                "batch_size": rt.batch_size,
                "contexts": len(rt.contexts),
                "published": self.published[name],
                "errors": self.errors[name],
                "device_timeouts": self.timeouts[name],
                "last_error": self.last_error.get(name),
                "pacing": rt.pacing,
            }
            for name, rt in self.runtimes.items()
        }
        snap["contexts"] = {m: asdict(c) for m, c in self.scheduler.context_view().items()}
        if self.device is not None:
            st = self.device.stats
            snap["device"] = {
                "loads": st.loads,
                "hits": st.hits,
                "evictions": st.evict,
                "timeouts": st.timeouts,
                "parked_contexts": self.device.parked_contexts,
                "failed": self.device.failed,
            }
            sim = getattr(self.device, "sim", None)
            if sim is not None:
                snap["device"]["sim_device_time_s"] = sim.device_time_s
        return snap

    def device_info(self) -> dict[str, str]:
        """The stage's backend and, on sim, its pacing (the `info` of its stats entry)."""
        info: dict[str, str] = {"backend": self.options.backend}
        if self.options.backend == "sim":
            info["pacing"] = self.options.sim.pacing
        return info

    def device_gauges(self) -> dict[str, float]:
        """The stage's device-wide gauges (the `<stage>` entry of pipeline.metrics): busy
        fraction and seconds, context loads / evictions as the scheduler models them, closes
        that failed at shutdown, and when there is a device its own context counters, its
        dispatches past their deadline, its parked contexts and whether it is marked failed.
        Read from any thread."""
        assert self.scheduler is not None
        st = self.scheduler.stats
        gauges: dict[str, float] = {
            "device_busy_fraction": st.busy_fraction(now_ns()),
            "device_busy_seconds": st.busy_s,
            "context_loads": st.context_loads,
            "context_evictions": st.context_evictions,
            "queued": self.scheduler.pending(),
            "in_flight": len(self.scheduler.in_flight),
            "close_errors": self.close_errors,
        }
        if self.device is not None:
            dev = self.device.stats
            gauges["device_context_loads"] = dev.loads
            gauges["device_context_hits"] = dev.hits
            gauges["device_context_evictions"] = dev.evict
            gauges["device_timeouts"] = dev.timeouts
            gauges["device_parked_contexts"] = self.device.parked_contexts
            gauges["device_failed"] = float(self.device.failed is not None)
        return gauges

    def model_gauges(self, model: str) -> dict[str, float]:
        """One model's gauges (the `<stage>/<model>` entry of pipeline.metrics): batches,
        fill ratio, padded slots, padding waste, queue wait mean / max (submit to dispatch),
        the learned pass cost and its bound, queued jobs, published results, errors (every
        failed job) and device timeouts (those dropped `device_timeout`); for
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
            "device_timeouts": self.timeouts[model],
        }
        rt = self.runtimes.get(model)
        if rt is not None:
            gauges.update(rt.gauges())
        return gauges
