"""The scheduler's model of the device's resident hardware contexts: an LRU of NPU2's 16 slots,
each context counted against the model that loaded it (the device's own cache:
npu/device/contexts.py ContextCache)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from stages.batches import SchedulerError

NPU2_CONTEXT_SLOTS = 16
CONTEXT_LOAD_S = 0.0025  # per context load/switch on NPU2 (~2-3 ms)


@dataclass(slots=True)
class ContextShare:
    """One model's part of the modelled context budget.

    contexts: the context keys it needs at once; resident: how many are resident now;
    loads: contexts it had to load; evicted: its contexts evicted, by the model whose load
    needed the slot; load_s: the seconds one load costs it (measured on the device once
    observed, else the scheduler's default) and whether that figure was measured.
    """

    contexts: tuple[str, ...]
    resident: int = 0
    loads: int = 0
    evicted: dict[str, int] = field(default_factory=dict)
    load_s: float = 0.0
    measured: bool = False


class ContextLRU:
    """A model of the device's resident hardware contexts: `capacity` slots, LRU eviction,
    each context counted against the model that loaded it."""

    def __init__(self, capacity: int = NPU2_CONTEXT_SLOTS) -> None:
        if capacity < 1:
            raise SchedulerError(f"context LRU: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._resident: OrderedDict[str, str] = OrderedDict()  # key -> owning model
        self.loads = 0
        self.evictions = 0
        self.loads_by: Counter = Counter()  # model -> contexts it loaded
        self.evicted: Counter = Counter()  # (owner, evicting model) -> count

    @property
    def resident(self) -> tuple[str, ...]:
        """Resident keys, least recently used first."""
        return tuple(self._resident)

    def resident_of(self, owner: str) -> int:
        """How many resident contexts `owner` loaded."""
        return sum(o == owner for o in self._resident.values())

    def missing(self, keys: Iterable[str], after: Iterable[str] = ()) -> int:
        """How many of `keys` would have to be loaded, if `after` were used first."""
        after = tuple(after)
        if not after:
            return sum(key not in self._resident for key in keys)
        trial = ContextLRU(self.capacity)
        trial._resident = OrderedDict(self._resident)
        trial.use(after)
        return trial.missing(keys)

    def use(self, keys: Iterable[str], owner: str = "") -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Make `keys` resident (most recent) for `owner`; returns (loaded, evicted), in order."""
        keys = tuple(keys)
        if len(set(keys)) > self.capacity:
            raise SchedulerError(
                f"context LRU: {len(set(keys))} contexts needed at once, capacity {self.capacity}"
            )
        needed = set(keys)
        loaded: list[str] = []
        evicted: list[str] = []
        for key in keys:
            if key in self._resident:
                self._resident.move_to_end(key)
                continue
            if len(self._resident) >= self.capacity:
                victim = next(k for k in self._resident if k not in needed)
                self.evicted[(self._resident.pop(victim), owner)] += 1
                evicted.append(victim)
            self._resident[key] = owner
            loaded.append(key)
        self.loads += len(loaded)
        self.evictions += len(evicted)
        self.loads_by[owner] += len(loaded)
        return tuple(loaded), tuple(evicted)
