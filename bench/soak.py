"""Soak: run a 4-camera pipeline for a long time and fail on resource growth after warm-up.

Four looping cameras (the sample clips bikes, carphone and bigbuckbunny, and the synthetic
test card) run in this process through one of two paths:
  sim     capture -> detect (BlazePose persons, BlazeFace faces, tracked) -> align ->
          infer on the SIMULATED NPU (backend sim; synthetic-weight Sapiens2, AdaFace and
          CLIP unless bundles are configured) -> dark / face_match / clip_labels -> publish
  engine  capture -> publish (the engine alone)
A subscriber thread reads every published message, as a healthy client would.

RSS keeps rising for the first ~100 s on the sim path (glibc malloc arenas filling as the
worker threads allocate; Python and numpy memory, traced with tracemalloc, stays flat), so the
default warm-up is min(300 s, run / 4). Run as a program, the soak applies the process settings
of the `npucam` executable first (pipeline/entry.py: glibc capped at 2 malloc arenas), so it
measures the pipeline as `npucam run` runs it; soak() called inside another process does not.

Every --sample-s seconds it records RSS (VmRSS), open file descriptors (/proc/self/fd),
asyncio tasks, threads and executor workers. After --warmup-s, the first window of samples
is the baseline and the last window the final state (a window is 10% of the post-warm-up
time, at least 3 samples); it fails when
  - RSS grew more than --rss-limit (default 5%) from the baseline median to the final median;
  - the final median of fds, tasks or threads exceeds the baseline window's maximum (a leak;
    the executor's workers start on demand up to its cap and are reported, not checked);
  - a camera published nothing in the final window (a stalled pipeline leaks nothing);
  - the pipeline did not stop cleanly (exit code, abandoned stages, reader threads left).
All device numbers on the sim path are simulated, never hardware measurements.

Run: .venv/bin/python bench/soak.py [--minutes 30] [--path sim|engine] [--json FILE]
(`make soak` runs the 30-minute sim version; tests/reliability/test_soak.py a 2-minute one.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq

from pipeline import wire
from pipeline.assets import asset_path
from pipeline.config import load_config
from pipeline.entry import configure_process
from pipeline.graph import Pipeline

CAMERAS = {
    "bikes": "sample:bikes.mp4",
    "carphone": "sample:carphone_pristine.mp4",
    "bunny": "sample:bigbuckbunny.mp4",
    "card": "synthetic:?width=320&height=240&fps=15",
}


# Long enough for a synthetic Sapiens2 pass on the simulated device to finish in time, so
# every result kind (det, pose, face, clip) is published during the soak.
STALENESS_MS = 5000
WORKERS = 8  # the pipeline's executor (blocking stage work); its threads start on demand


def config_text(path: str, endpoint: str, work_dir: Path) -> str:
    """The soak pipeline's TOML (docs/configuration.md) for path "sim" or "engine"."""
    cams = "".join(
        f"""
        [[cameras]]
        name = "{name}"
        url = "{url}"
        loop = true
        staleness_ms = {STALENESS_MS}
        """
        for name, url in CAMERAS.items()
    )
    head = f"""
        [metrics]
        stats_interval_s = 5.0
        {cams}
        [[stages]]
        kind = "capture"
    """
    publish = f"""
        [[stages]]
        kind = "publish"
        bind = "{endpoint}"
        inbox = {{ size = 64, policy = "drop_oldest" }}
    """
    if path == "engine":
        return textwrap.dedent(head + publish)
    middle = f"""
        [[stages]]
        kind = "detect"
        to = ["publish", "align"]
        face_in = "persons"
        face_interval_s = 0.5
        clip = "persons"
        clip_interval_s = 1.0
        pose_jobs_per_frame = 1
        inbox = {{ size = 2, policy = "latest" }}

        [[stages]]
        kind = "align"
        to = ["infer"]
        inbox = {{ size = 16 }}

        [[stages]]
        kind = "infer"
        backend = "sim"
        to = ["dark", "face_match", "clip_labels"]
        synthetic_cache = "{work_dir / "synthetic"}"
        inbox = {{ size = 32 }}
        sapiens2 = {{ enabled = true, synthetic = true }}
        adaface = {{ enabled = true, synthetic = true }}
        [stages.clip]
        enabled = true
        synthetic = true
        labels = ["person riding a bicycle", "person talking on a phone", "person walking"]
        [stages.sim]
        pacing = "stand-in"  # the models' own speed: many passes, so a leak shows
        registry_dir = "{work_dir / "hwctx"}"

        [[stages]]
        kind = "dark"
        to = ["publish"]
        inbox = {{ size = 16 }}

        [[stages]]
        kind = "face_match"
        gallery = "{work_dir / "gallery.npz"}"
        to = ["publish"]
        inbox = {{ size = 16 }}

        [[stages]]
        kind = "clip_labels"
        to = ["publish"]
        inbox = {{ size = 16 }}
    """
    return textwrap.dedent(head + middle + publish)


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    fds: int
    tasks: int
    threads: int  # every thread but the executor's workers
    workers: int  # executor workers: started on demand up to WORKERS, then reused
    messages: dict[str, int]


@dataclass
class SoakResult:
    path: str
    seconds: float
    warmup_s: float
    samples: list[Sample] = field(default_factory=list)
    checks: dict[str, dict] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    exit_code: int | None = None
    topics: dict[str, int] = field(default_factory=dict)
    drops: dict[str, dict] = field(default_factory=dict)  # stage -> camera -> reason -> n

    @property
    def ok(self) -> bool:
        return not self.failures


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Subscriber(threading.Thread):
    """Reads every message of endpoint until stop(); counts them per camera and per topic."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(name="soak-subscriber", daemon=True)
        self.endpoint = endpoint
        self.per_camera: Counter = Counter()
        self.per_topic: Counter = Counter()
        self.errors = 0
        self._done = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        try:
            while not self._done.is_set():
                if not sock.poll(100):
                    continue
                parts = sock.recv_multipart()
                try:
                    m = wire.decode(parts)
                except wire.WireError:
                    self.errors += 1
                    continue
                self.per_topic[m.topic.split("/")[0]] += 1
                if m.header["camera"]:
                    self.per_camera[m.header["camera"]] += 1
        finally:
            sock.close(0)
            ctx.term()

    def stop(self) -> None:
        self._done.set()
        self.join(5)


def evaluate(result: SoakResult, rss_limit: float, cameras: list[str]) -> None:
    """Fill result.checks and result.failures from result.samples (see the module docstring)."""
    after = [s for s in result.samples if s.t_s >= result.warmup_s]
    if len(after) < 6:
        result.failures.append(f"only {len(after)} samples after warm-up; run longer")
        return
    n = max(3, len(after) // 10)
    base, final = after[:n], after[-n:]
    rss_base = statistics.median(s.rss_mb for s in base)
    rss_final = statistics.median(s.rss_mb for s in final)
    growth = rss_final / rss_base - 1
    result.checks["rss"] = {
        "baseline_mb": round(rss_base, 1),
        "final_mb": round(rss_final, 1),
        "growth": round(growth, 4),
        "limit": rss_limit,
    }
    if growth > rss_limit:
        result.failures.append(
            f"RSS grew {growth:.1%} after warm-up ({rss_base:.1f} -> {rss_final:.1f} MB; "
            f"limit {rss_limit:.0%})"
        )
    workers = max(s.workers for s in after)
    result.checks["workers"] = {"max": workers, "cap": WORKERS}
    for what in ("fds", "tasks", "threads"):
        base_max = max(getattr(s, what) for s in base)
        final_median = statistics.median(getattr(s, what) for s in final)
        result.checks[what] = {"baseline_max": base_max, "final_median": final_median}
        if final_median > base_max:
            result.failures.append(
                f"{what} leak: {final_median:g} at the end, at most {base_max} after warm-up"
            )
    first, last = final[0].messages, final[-1].messages
    flowing = {c: last.get(c, 0) - first.get(c, 0) for c in cameras}
    result.checks["final_window_messages"] = flowing
    for cam, count in flowing.items():
        if count <= 0:
            result.failures.append(f"camera {cam}: nothing published in the final window")


def soak(
    seconds: float,
    path: str = "sim",
    warmup_s: float | None = None,
    sample_s: float = 5.0,
    rss_limit: float = 0.05,
    progress=print,
) -> SoakResult:
    """Run the soak pipeline for seconds and evaluate it; see the module docstring."""
    for url in CAMERAS.values():
        if url.startswith("sample:"):
            asset_path(url.partition(":")[2])  # AssetError says to run `make setup`
    warmup_s = min(300.0, seconds / 4) if warmup_s is None else warmup_s
    result = SoakResult(path=path, seconds=seconds, warmup_s=warmup_s)
    threads_before = {t.ident for t in threading.enumerate()}
    with tempfile.TemporaryDirectory(prefix="npucam-soak-") as tmp:
        work = Path(tmp)
        endpoint = f"ipc://{work / 'publish.sock'}"
        config_path = work / "soak.toml"
        config_path.write_text(config_text(path, endpoint, work))
        pipeline = Pipeline(load_config(config_path))
        sub = Subscriber(endpoint)
        sub.start()

        async def main() -> int:
            task = asyncio.create_task(pipeline.run(duration=seconds))
            t0 = time.monotonic()
            while not task.done():
                await asyncio.wait([task], timeout=sample_s)
                if task.done():
                    break
                workers = sum(t.name.startswith("soak-worker") for t in threading.enumerate())
                s = Sample(
                    t_s=round(time.monotonic() - t0, 1),
                    rss_mb=round(rss_mb(), 2),
                    fds=open_fds(),
                    tasks=len(asyncio.all_tasks()),
                    threads=threading.active_count() - workers,
                    workers=workers,
                    messages=dict(sub.per_camera),
                )
                result.samples.append(s)
                progress(
                    f"t={s.t_s:7.1f}s rss={s.rss_mb:8.1f} MB fds={s.fds:4d} tasks={s.tasks:3d} "
                    f"threads={s.threads:3d}+{s.workers} workers "
                    f"messages={sum(s.messages.values())}"
                )
            return task.result()

        executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="soak-worker")
        loop = asyncio.new_event_loop()
        loop.set_default_executor(executor)
        try:
            result.exit_code = loop.run_until_complete(main())
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
        sub.stop()
        result.topics = dict(sub.per_topic)
        result.drops = {
            stage: entry["drops"]
            for stage, entry in pipeline.metrics.snapshot()["stages"].items()
            if entry.get("drops")
        }
        evaluate(result, rss_limit, list(CAMERAS))
        if result.exit_code != 0:
            result.failures.append(f"the pipeline exited {result.exit_code}")
        if pipeline.abandoned:
            result.failures.append(f"stages did not drain: {pipeline.abandoned}")
        time.sleep(0.5)
        left = [
            t.name
            for t in threading.enumerate()
            if t.ident not in threads_before and t.is_alive() and not t.daemon
        ]
        capture_left = [t.name for t in threading.enumerate() if t.name.startswith("capture-")]
        if left or capture_left:
            result.failures.append(f"threads left after the run: {left + capture_left}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--path", choices=("sim", "engine"), default="sim")
    p.add_argument("--warmup-s", type=float, default=None, help="default: min(300 s, run / 4)")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--rss-limit", type=float, default=0.05, help="allowed RSS growth (0.05 = 5%%)")
    p.add_argument("--json", metavar="FILE", help="write samples, checks and failures here")
    args = p.parse_args(argv)
    configure_process()  # as the npucam executable does, before any thread starts
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = soak(args.minutes * 60, args.path, args.warmup_s, args.sample_s, args.rss_limit)
    print(f"\nsoak ({result.path} path, {result.seconds:.0f} s, warm-up {result.warmup_s:.0f} s)")
    for name, check in result.checks.items():
        print(f"  {name}: {check}")
    print(f"  published per topic: {result.topics}")
    print(f"  pipeline drops (stage: camera: reason: n): {result.drops}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=1))
    if result.failures:
        print("FAILED:\n  " + "\n  ".join(result.failures))
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
