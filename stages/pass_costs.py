"""Each model's learned pass cost for the batching scheduler (stages/scheduler.py): an
exponential moving average of measured device times and of their absolute deviation, the
bound deadlines are judged on, the optimistic floor drops are judged on, and the decay of a
blocked model's estimate toward its profile, or toward zero before any pass has measured it
(docs/scheduler.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from stages.batches import ModelProfile, SchedulerError


class PassCosts:
    """Per model: `estimate_s` (starts at the profile's cost_s) and `dev_s`, the mean absolute
    deviation of measured passes from it (starts at a tenth of cost_s)."""

    def __init__(
        self,
        profiles: dict[str, ModelProfile],
        alpha: float,
        margin_devs: float,
        recovery_half_life_s: float,
    ) -> None:
        if not 0 < alpha <= 1:
            raise SchedulerError(f"scheduler: cost_alpha must be in (0, 1], got {alpha}")
        for name, value in (
            ("margin_devs", margin_devs),
            ("recovery_half_life_s", recovery_half_life_s),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise SchedulerError(f"scheduler: {name} must be finite and >= 0, got {value}")
        self.profiles = profiles
        self.alpha = alpha
        self.margin_devs = margin_devs
        # while a model's own cost bound keeps all its queued jobs from running (and no pass
        # re-measures it), the excess of its estimate and deviation over the profile's
        # halves this often; while a model no pass has measured yet has its jobs refused by
        # its optimistic cost (the profile's cost may itself be the slow figure: a warm-up
        # measured on a starved host), its estimate and deviation halve this often
        self.recovery_half_life_s = recovery_half_life_s
        self.estimate_s: dict[str, float] = {name: p.cost_s for name, p in profiles.items()}
        self.dev_s: dict[str, float] = {name: 0.1 * p.cost_s for name, p in profiles.items()}
        self.unmeasured: set[str] = set(profiles)  # no pass has measured them yet
        self.refused: set[str] = set()  # unmeasured, and their own cost refused a job

    def bound_s(self, model: str) -> float:
        """The cost deadlines are judged on: estimate + margin_devs x mean abs deviation."""
        return self.estimate_s[model] + self.margin_devs * self.dev_s[model]

    def floor_s(self, model: str) -> float:
        """The optimistic pass cost `npu_busy` drops are judged on: the lower of the estimate
        and the profile's cost (a pass that once took that long may again; the estimate of a
        `refused` model decays below the profile's)."""
        return min(self.estimate_s[model], self.profiles[model].cost_s)

    def refuse(self, model: str) -> None:
        """One of `model`'s jobs was refused (`npu_busy`) by its optimistic cost alone: it
        would have missed its deadline even starting at once."""
        if model in self.unmeasured:
            self.refused.add(model)

    def observe(self, model: str, measured_s: float) -> float:
        """Learn from one pass's device time (context loads excluded); the new estimate. The
        first pass of a `refused` model replaces the relaxed warm-up figure."""
        if model in self.refused:
            self.estimate_s[model], self.dev_s[model] = measured_s, 0.1 * measured_s
        self.unmeasured.discard(model)
        self.refused.discard(model)
        cost = self.estimate_s[model]
        self.dev_s[model] += self.alpha * (abs(measured_s - cost) - self.dev_s[model])
        cost += self.alpha * (measured_s - cost)
        self.estimate_s[model] = cost
        return cost

    def relax(self, models: Iterable[str], elapsed_ns: int) -> None:
        """Decay the estimates of `models` (blocked by their own cost bound for elapsed_ns,
        or `refused`, with no pass in flight to re-measure them) toward their profiles, or
        toward zero if `refused` (the profile's cost is then the slow figure), until a job
        is tried and its pass measures the model: a slow pass (a loaded host, a one-time
        stall) must not keep a model off the device for good. A model truly too slow for its
        deadlines is so tried once, then judged on what its pass measured."""
        half_life_ns = round(self.recovery_half_life_s * 1_000_000_000)
        keep = 0.5 ** (elapsed_ns / half_life_ns) if half_life_ns else 0.0
        for name in models:
            base = 0.0 if name in self.refused else self.profiles[name].cost_s
            for values, floor in ((self.estimate_s, base), (self.dev_s, 0.1 * base)):
                if values[name] > floor:
                    values[name] = floor + (values[name] - floor) * keep
