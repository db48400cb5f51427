"""SIMULATED benchmark: the batching scheduler vs a FIFO one-job-at-a-time baseline.

A discrete-event simulation (no NPU, no wall-clock timing): faces (AdaFace), person boxes
(Sapiens2) and CLIP crops arrive from 4 cameras as Poisson streams above the device's
capacity; both schedulers see the same arrival trace, the same device-time model (per-item
costs from the NPU2 field notes, drawn per run) and the same 16-context LRU with a per-load
switch cost. The baseline runs jobs in arrival order, one per device pass (a CLIP pass then
carries 1 image instead of 4), skipping jobs already past their deadline, from a drop-oldest
queue; it is run with the scheduler's total queue capacity (96) and with every bound in
FIFO_QUEUE_SIZES, and the best of those is the baseline the target is judged on. Only results
delivered before their deadline count. Host glue time is not modelled (so the overlap of the
next batch's glue with the device run earns nothing here). Every number printed is simulated.

Usage: .venv/bin/python bench/scheduler.py [--seconds 600] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from stages.batches import ModelProfile, QueuedJob
from stages.context_lru import CONTEXT_LOAD_S, ContextLRU
from stages.planning.simulate import SimClock, simulate
from stages.scheduler import BatchScheduler

S = 1_000_000_000
CAMERAS = ("cam0", "cam1", "cam2", "cam3")


@dataclass(frozen=True)
class Workload:
    """One model's share of the simulated load."""

    model: str
    batch_size: int
    contexts: int
    cost_s: tuple[float, float]  # device time per pass, drawn uniformly in this range
    rate_per_camera: float  # Poisson arrivals per second per camera
    budget_s: float  # staleness budget: deadline = capture + budget
    max_wait_ms: float


WORKLOADS = (
    Workload("adaface", 1, 16, (0.2, 0.5), 0.8, 2.0, 0.0),
    Workload("sapiens2", 1, 7, (2.4, 4.0), 0.1, 8.0, 0.0),
    Workload("clip", 4, 8, (1.25, 1.35), 0.5, 3.0, 150.0),
)


def profiles() -> list[ModelProfile]:
    """Profiles with the midpoint cost as the initial estimate (the EMA learns the rest)."""
    return [
        ModelProfile(
            w.model,
            w.batch_size,
            w.max_wait_ms,
            tuple(f"{w.model}/{i}" for i in range(w.contexts)),
            sum(w.cost_s) / 2,
            queue_size=32,
        )
        for w in WORKLOADS
    ]


def arrivals(seconds: float, seed: int) -> list[tuple[int, str, str, int]]:
    """(capture ns, model, camera, deadline ns), sorted by time."""
    rng = random.Random(seed)
    out = []
    for w in WORKLOADS:
        for cam in CAMERAS:
            t = rng.expovariate(w.rate_per_camera)
            while t < seconds:
                ts = round(t * S)
                out.append((ts, w.model, cam, ts + round(w.budget_s * S)))
                t += rng.expovariate(w.rate_per_camera)
    out.sort()
    return out


class DeviceModel:
    """Simulated device time of one pass: a uniform draw in the model's cost range."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cost = {w.model: w.cost_s for w in WORKLOADS}

    def pass_s(self, model: str) -> float:
        lo, hi = self.cost[model]
        return self.rng.uniform(lo, hi)


@dataclass
class RunStats:
    name: str
    seconds: float
    busy_s: float = 0.0
    loads: int = 0
    latencies: list[float] | None = None
    results: Counter | None = None
    drops: Counter | None = None
    late: int = 0
    queue_size: int = 0

    def row(self) -> dict[str, float]:
        lat = np.array(self.latencies or [0.0])
        n = sum(self.results.values())
        return {
            "device utilisation": self.busy_s / self.seconds,
            "results/s (on time)": n / self.seconds,
            "latency p50 s": float(np.percentile(lat, 50)),
            "latency p95 s": float(np.percentile(lat, 95)),
            "context loads/min": self.loads / (self.seconds / 60),
            **{f"results/s {m}": self.results[m] / self.seconds for m in sorted(self.results)},
            "device-computed but late": self.late,
        }


def run_scheduler(trace, seconds: float, seed: int) -> RunStats:
    clock = SimClock()
    sched = BatchScheduler(profiles(), clock=clock)
    device = DeviceModel(seed)
    events = [
        (ts, lambda m=m, c=c, ts=ts, d=d: sched.submit(QueuedJob(m, c, ts, d)))
        for ts, m, c, d in trace
    ]
    report = simulate(
        sched,
        clock,
        events,
        lambda b: b.switch_s + device.pass_s(b.model),
        round(seconds * S),
    )
    stats = RunStats("scheduler", seconds)
    stats.busy_s = sched.stats.busy_s
    stats.loads = sched.stats.context_loads
    stats.latencies = [(t - job.payload) / S for t, job, _ in report.results]
    stats.results = Counter(job.model for _, job, _ in report.results)
    stats.drops = sched.stats.drops_by_reason()
    returned = {id(job) for _, job, _ in report.results}
    stats.late = sum(id(j) not in returned for _, _, b in report.batches for j in b.jobs)
    return stats


FIFO_QUEUE_SIZES = (1, 2, 4, 8, 16, 32, 96)


def run_fifo(trace, seconds: float, seed: int, queue_size: int) -> RunStats:
    """One job per device pass in arrival order from a drop-oldest queue of queue_size;
    jobs already past their deadline are skipped."""
    device = DeviceModel(seed)
    lru = ContextLRU()
    contexts = {p.name: p.contexts for p in profiles()}
    queue: deque = deque()
    stats = RunStats(f"fifo q{queue_size}", seconds, latencies=[], results=Counter())
    stats.queue_size = queue_size
    stats.drops = Counter()
    end = round(seconds * S)
    t = 0
    i = 0
    while True:
        while i < len(trace) and trace[i][0] <= t:
            if len(queue) >= queue_size:
                queue.popleft()
                stats.drops["queue_full"] += 1
            queue.append(trace[i])
            i += 1
        while queue and queue[0][3] < t:
            queue.popleft()
            stats.drops["stale"] += 1
        if not queue:
            if i >= len(trace) or trace[i][0] > end:
                break
            t = trace[i][0]
            continue
        ts, model, _, deadline = queue.popleft()
        loads, _ = lru.use(contexts[model])
        run = len(loads) * CONTEXT_LOAD_S + device.pass_s(model)
        finish = t + round(run * S)
        if finish > end:
            break
        stats.busy_s += run
        stats.loads += len(loads)
        t = finish
        if finish <= deadline:
            stats.results[model] += 1
            stats.latencies.append((finish - ts) / S)
        else:
            stats.late += 1
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="simulated seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trace = arrivals(args.seconds, args.seed)
    demand = sum(
        w.rate_per_camera * len(CAMERAS) * sum(w.cost_s) / 2 / w.batch_size for w in WORKLOADS
    )
    print(
        f"SIMULATED (discrete-event, no NPU): {args.seconds:.0f} s, {len(CAMERAS)} cameras, "
        f"{len(trace)} jobs, seed {args.seed}; offered load {demand:.2f}x the device "
        f"with full CLIP batches"
    )
    for w in WORKLOADS:
        print(
            f"  {w.model}: {w.rate_per_camera}/s per camera, pass {w.cost_s[0]}-{w.cost_s[1]} s, "
            f"batch {w.batch_size}, {w.contexts} contexts, budget {w.budget_s} s"
        )
    print(f"  16-context LRU, {CONTEXT_LOAD_S * 1000:.1f} ms per context load")
    ours = run_scheduler(trace, args.seconds, args.seed + 1)
    fifos = {n: run_fifo(trace, args.seconds, args.seed + 1, n) for n in FIFO_QUEUE_SIZES}
    # two baselines: the same total queue capacity as the scheduler (3 models x 32), and the
    # FIFO's best queue bound in hindsight (a short FIFO queue is "latest wins")
    same = fifos[96]
    best = max(fifos.values(), key=lambda r: sum(r.results.values()))
    print(
        "  fifo results/s by queue bound: "
        + ", ".join(f"{n}: {sum(r.results.values()) / args.seconds:.3f}" for n, r in fifos.items())
    )
    runs = [("scheduler", ours), ("fifo q96", same), (f"fifo q{best.queue_size}", best)]
    rows = [run.row() for _, run in runs]
    print(f"\n{'simulated measure':28s}" + "".join(f"{name:>13s}" for name, _ in runs))
    for key in dict.fromkeys(k for row in rows for k in row):
        print(f"{key:28s}" + "".join(f"{row.get(key, 0.0):13.3f}" for row in rows))
    for name, run in runs:
        print(f"drops ({name}): {dict(sorted(run.drops.items()))}")
    print()
    for name, row in zip([n for n, _ in runs[1:]], rows[1:], strict=True):
        speedup = rows[0]["results/s (on time)"] / row["results/s (on time)"]
        loads = rows[0]["context loads/min"] / row["context loads/min"]
        print(f"SIMULATED scheduler / {name}: results/s {speedup:.2f}x, context loads {loads:.2f}x")
    # the target is judged against the stronger baseline
    speedup = rows[0]["results/s (on time)"] / rows[2]["results/s (on time)"]
    fewer = rows[0]["context loads/min"] < rows[2]["context loads/min"]
    met = speedup >= 1.5 and fewer
    print(
        f"target vs the best FIFO (>= 1.5x results/s with fewer context loads): "
        f"{'met' if met else 'NOT met'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
