"""The LRU of resident hardware contexts (TACONITE_CTX_CACHE, evict-and-retry, the bounded wait
for slots other processes hold) and each model's share of it, as taconite's shims keep them.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from npu.device.errors import DeviceError
from npu.device.kernels import KernelTiming

DEFAULT_CTX_CACHE = 16


# taconite-sapiens2 npu.rs `WAITS` (50 at 465946c; 200 at 1e2c515): 100 ms waits for a slot
# other processes hold, once this process has no context of its own left to give up.
CONTEXT_WAITS = 50


CONTEXT_WAIT_S = 0.1


def ctx_cache_cap(environ: Mapping[str, str] | None = None) -> int:
    """The resident-context cap: `TACONITE_CTX_CACHE` if it is a usize >= 1, else 16.

    Follows the Rust reader of taconite-adaface (`parse::<usize>()`: an optional leading
    `+`, digits only), not the older C `strtol` one.
    """
    env = os.environ if environ is None else environ
    raw = env.get("TACONITE_CTX_CACHE")
    if raw is None or not re.fullmatch(r"\+?[0-9]+", raw):
        return DEFAULT_CTX_CACHE
    value = int(raw)
    return value if value >= 1 else DEFAULT_CTX_CACHE


@dataclass
class DeviceStats:
    """Counters of the TACONITE_TIMING line: loads = context creations, hits = LRU hits,
    evict = evictions; load_s = time creating contexts, run_s = host wall time of the
    dispatches, wait_s = launch + wait time. Wall-clock seconds, on any backend."""

    loads: int = 0
    hits: int = 0
    evict: int = 0
    runs: int = 0
    load_s: float = 0.0
    run_s: float = 0.0
    wait_s: float = 0.0
    timeouts: int = 0  # dispatches that passed their deadline
    kernels: dict[str, KernelTiming] = field(default_factory=dict)

    def line(self, backend: str) -> str:
        return (
            f"[{backend}] loads={self.loads} hits={self.hits} evict={self.evict} runs={self.runs}"
            f"  load={self.load_s:.3f}s run={self.run_s:.3f}s (wait={self.wait_s:.3f}s)"
        )


def context_full(exc: BaseException) -> bool:
    """Whether a context-creation failure means "no free slot": evict one more and retry."""
    return isinstance(exc, RuntimeError) or "CREATE_HWCTX" in str(exc)


@dataclass
class ModelContexts:
    """One model's share of the device's context budget, as the device saw it.

    resident: its context keys resident now (least recently used first); loads: contexts it
    created; load_s: their creation cost (seconds: wall clock on XRT, modelled on the sim);
    evicted: its contexts evicted to make room, by the model that needed the room ("" for a
    load with no owner); waits / wait_s: waits for slots other processes held.
    """

    resident: tuple[str, ...] = ()
    loads: int = 0
    load_s: float = 0.0
    evicted: dict[str, int] = field(default_factory=dict)
    waits: int = 0
    wait_s: float = 0.0

    @property
    def load_cost_s(self) -> float | None:
        """Measured seconds per context load, None before the first load."""
        return self.load_s / self.loads if self.loads else None


class ContextCache:
    """An LRU of resident hardware contexts keyed by context key, capped at `cap`, each
    counted against the model (owner) that loaded it.

    A hit moves the entry to the most-recent end. A miss evicts from the least-recent end
    while the cache is at the cap, then creates; when creation fails with "no free slot"
    (context_full), it evicts one more and retries while anything of this process is
    resident (taconite-adaface's policy; taconite-sapiens2 gives up its least recently used
    other context the same way). With nothing left to give up, the slots belong to other
    processes: it waits `waits` x `wait_s` for one to free (taconite-sapiens2's WAITS), then
    fails with `load(<key>): ...` naming the holders when `holders()` knows them.
    cost(wall seconds) -> the seconds a creation is counted as (the sim: its modelled time).
    """

    def __init__(
        self,
        cap: int,
        create: Callable[[str], Any],
        release: Callable[[str, Any], None],
        stats: DeviceStats,
        *,
        holders: Callable[[], str] | None = None,
        cost: Callable[[float], float] | None = None,
        waits: int = CONTEXT_WAITS,
        wait_s: float = CONTEXT_WAIT_S,
    ) -> None:
        self.cap = cap
        self._create = create
        self._release = release
        self._stats = stats
        self._holders = holders
        self._cost = cost or (lambda wall: wall)
        self.waits, self.wait_s = waits, wait_s
        self._lru: OrderedDict[str, Any] = OrderedDict()
        self._owner: dict[str, str] = {}
        self.models: dict[str, ModelContexts] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._lru

    def keys(self) -> list[str]:
        """Resident keys, least recently used first."""
        return list(self._lru)

    def _model(self, owner: str) -> ModelContexts:
        return self.models.setdefault(owner, ModelContexts())

    def view(self) -> dict[str, ModelContexts]:
        """Every model's ModelContexts, with `resident` filled in now."""
        for owner, m in self.models.items():
            m.resident = tuple(k for k in self._lru if self._owner.get(k) == owner)
        return dict(self.models)

    def acquire(self, key: str, owner: str = "") -> Any:
        if key in self._lru:
            self._lru.move_to_end(key)
            self._stats.hits += 1
            return self._lru[key]
        while len(self._lru) >= self.cap:
            self.evict_lru(owner)
        model = self._model(owner)
        t0 = time.perf_counter()
        waited = 0
        while True:
            try:
                ctx = self._create(key)
                break
            except Exception as exc:
                name = key.replace(chr(10), " ")
                if not context_full(exc):
                    raise DeviceError(f"load({name}): {exc}") from exc
                if self._lru:
                    self.evict_lru(owner)
                    continue
                if waited >= self.waits:
                    raise DeviceError(
                        f"load({name}): {exc}: every NPU hardware context is taken by other "
                        f"models or programs (NPU2 has 16; {self._holders_text()}); free some "
                        "and try again"
                    ) from exc
                waited += 1
                model.waits += 1
                model.wait_s += self.wait_s
                time.sleep(self.wait_s)
        wall = time.perf_counter() - t0 - waited * self.wait_s
        self._stats.loads += 1
        self._stats.load_s += wall
        model.loads += 1
        model.load_s += self._cost(wall)
        self._lru[key] = ctx
        self._owner[key] = owner
        return ctx

    def _holders_text(self) -> str:
        held = self._holders() if self._holders is not None else ""
        return held or "which programs hold them is unknown"

    def evict_lru(self, by: str = "") -> None:
        key, ctx = self._lru.popitem(last=False)
        victim = self._model(self._owner.pop(key, ""))
        victim.evicted[by] = victim.evicted.get(by, 0) + 1
        self._stats.evict += 1
        self._release(key, ctx)

    def take(self, key: str) -> Any:
        """Remove a context without releasing it (it is being parked); None if not resident."""
        return self._lru.pop(key, None)

    def drop(self, key: str) -> None:
        """Free a context whose last kernel was freed (not counted as an eviction)."""
        ctx = self._lru.pop(key, None)
        self._owner.pop(key, None)
        if ctx is not None:
            self._release(key, ctx)

    def clear(self) -> None:
        for key in list(self._lru):
            self.drop(key)
