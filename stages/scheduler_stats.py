"""The scheduler's counters and gauges per model and in all, as the infer stage exports them
(metrics, the `stats` topic)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_NS = 1_000_000_000


@dataclass(slots=True)
class ModelStats:
    """Plain counters for one model."""

    batches: int = 0
    slots: int = 0
    filled: int = 0
    padding_waste_s: float = 0.0
    wait_s_sum: float = 0.0
    wait_s_max: float = 0.0
    waits: int = 0
    results: int = 0
    replaced: int = 0
    cost_estimate_s: float = 0.0

    @property
    def fill_ratio(self) -> float:
        """Real slots over all slots dispatched (1.0 before the first batch)."""
        return self.filled / self.slots if self.slots else 1.0

    @property
    def mean_wait_s(self) -> float:
        """Mean queue wait (submit -> dispatch) of dispatched jobs."""
        return self.wait_s_sum / self.waits if self.waits else 0.0


@dataclass(slots=True)
class SchedulerStats:
    """Counters and gauges the stage exports (metrics, `stats` topic)."""

    started_ns: int
    busy_s: float = 0.0
    context_loads: int = 0
    context_evictions: int = 0
    drops: Counter = field(default_factory=Counter)  # (model, camera, reason) -> count
    results: Counter = field(default_factory=Counter)  # (model, camera) -> count
    models: dict[str, ModelStats] = field(default_factory=dict)

    def busy_fraction(self, at_ns: int) -> float:
        """Reported device run time over wall time since the scheduler started."""
        elapsed = (at_ns - self.started_ns) / _NS
        return self.busy_s / elapsed if elapsed > 0 else 0.0

    def drops_by_reason(self) -> Counter:
        """reason -> count, over all models and cameras."""
        out: Counter = Counter()
        for (_, _, reason), n in self.drops.items():
            out[reason] += n
        return out

    def snapshot(self, at_ns: int) -> dict[str, Any]:
        """Every counter and gauge as plain JSON-able values."""
        return {
            "device_busy_fraction": self.busy_fraction(at_ns),
            "device_busy_s": self.busy_s,
            "context_loads": self.context_loads,
            "context_evictions": self.context_evictions,
            "drops": [
                {"model": m, "camera": c, "reason": r, "count": n}
                for (m, c, r), n in sorted(self.drops.items())
            ],
            "results": [
                {"model": m, "camera": c, "count": n} for (m, c), n in sorted(self.results.items())
            ],
            "models": {
                name: {
                    "batches": s.batches,
                    "fill_ratio": s.fill_ratio,
                    "padded_slots": s.slots - s.filled,
                    "padding_waste_s": s.padding_waste_s,
                    "queue_wait_mean_s": s.mean_wait_s,
                    "queue_wait_max_s": s.wait_s_max,
                    "results": s.results,
                    "replaced": s.replaced,
                    "cost_estimate_s": s.cost_estimate_s,
                }
                for name, s in sorted(self.models.items())
            },
        }
