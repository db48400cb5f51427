"""Pipeline metrics: per-stage items in/out, drops by (stage, camera, reason), latency
histograms (queue wait, work time), per-camera capture stats (fps, health) and the gauges a
stage registers for itself (numbers by name, read at snapshot / scrape time).

One Metrics object per pipeline. snapshot() is the JSON of the `stats` topic; the same
numbers are exposed as Prometheus text over HTTP when [metrics] prometheus is set, with
names in the style Frigate users know (npucam_camera_fps, npucam_drops_total...).
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from pipeline.errors import NpucamError

log = logging.getLogger(__name__)

# Every drop names one of these reasons (docs/architecture.md); device_timeout: an NPU
# dispatch of the job passed its deadline (docs/inference.md); peer_slow: a zmq_push frame
# its receiver could not take (stages/frame_push.py); storage: a record stage could not store
# the item (disk full or read-only, over its size cap with nothing left to delete, or a frame
# to blur whose Detections never came: stages/record/).
DROP_REASONS = (
    "queue_full", "stale", "npu_busy", "error", "device_timeout", "peer_slow", "storage"
)  # fmt: skip
# Histogram bucket upper bounds in seconds, from 0.1 ms to 10 s; the last bucket is +Inf.
BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
             2.5, 5.0, 10.0)  # fmt: skip


# A stage gauge's name: its Prometheus family is npucam_stage_<name>; the stage counters'
# family names are taken.
GAUGE_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
RESERVED_GAUGE_NAMES = ("items_in", "items_out")

Gauges = Callable[[], Mapping[str, float]]


class MetricsError(NpucamError):
    """Metrics were used against their contract (an unknown drop reason, a bad address)."""


class Histogram:
    """Counts of observations per bucket (seconds), with their sum."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.total += seconds
        self.count += 1

    def quantile(self, q: float) -> float:
        """Upper bound (s) of the bucket holding the q-quantile; inf past the last bucket."""
        if not self.count:
            return 0.0
        rank, seen = q * self.count, 0
        for bound, n in zip((*BUCKETS_S, float("inf")), self.counts, strict=True):
            seen += n
            if seen >= rank:
                return bound
        return float("inf")

    def summary_ms(self) -> dict:
        """count, mean and bucket-bound p50/p95 in ms (the JSON of the stats topic)."""
        mean = self.total / self.count * 1e3 if self.count else 0.0
        return {
            "count": self.count,
            "mean_ms": round(mean, 3),
            "p50_ms": _ms(self.quantile(0.5)),
            "p95_ms": _ms(self.quantile(0.95)),
        }


def _ms(seconds: float) -> float | None:
    return None if seconds == float("inf") else round(seconds * 1e3, 3)


class Metrics:
    """Thread-safe counters and histograms of one pipeline run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.items_in: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.items_out: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.drops: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.queue_wait: defaultdict[str, Histogram] = defaultdict(Histogram)
        self.work_time: defaultdict[str, Histogram] = defaultdict(Histogram)
        self.queue_depth: dict[str, Callable[[], int]] = {}
        self.cameras: dict[str, Callable[[], dict]] = {}
        self.gauges: dict[str, Gauges] = {}
        self.info: dict[str, dict[str, str]] = {}
        self.clocks: dict[str, dict[str, str | float | None]] = {}
        self._bad_gauges: set[tuple[str, str]] = set()  # (stage, repr(name)) warned

    def count_in(self, stage: str, camera: str, n: int = 1) -> None:
        with self._lock:
            self.items_in[stage, camera] += n

    def count_out(self, stage: str, camera: str, n: int = 1) -> None:
        with self._lock:
            self.items_out[stage, camera] += n

    def drop(self, stage: str, camera: str, reason: str, n: int = 1) -> None:
        if reason not in DROP_REASONS:
            raise MetricsError(f"drop reason {reason!r} is not one of {', '.join(DROP_REASONS)}")
        with self._lock:
            self.drops[stage, camera, reason] += n

    def took(self, stage: str, camera: str, waited_s: float) -> None:
        """count_in + observe_queue_wait under one lock (the per-item path of every queue)."""
        with self._lock:
            self.items_in[stage, camera] += 1
            self.queue_wait[stage].observe(waited_s)

    def did(self, stage: str, camera: str, work_s: float) -> None:
        """count_out + observe_work under one lock."""
        with self._lock:
            self.items_out[stage, camera] += 1
            self.work_time[stage].observe(work_s)

    def observe_queue_wait(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.queue_wait[stage].observe(seconds)

    def observe_work(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.work_time[stage].observe(seconds)

    def add_queue(self, stage: str, depth: Callable[[], int]) -> None:
        """Report the depth of `stage`'s inbox in snapshots."""
        self.queue_depth[stage] = depth

    def add_camera(self, camera: str, stats: Callable[[], dict]) -> None:
        """Report a camera's capture stats (fps, health, frames, reconnects...) in snapshots."""
        self.cameras[camera] = stats

    def set_camera_clock(self, camera: str, state: str, offset_ms: float | None) -> None:
        """Report how a camera's clock compares with its rig's (stages.rig.sync): `state`
        ("not judged yet", "in step", "corrected") and the offset (ms ahead of the rig's),
        merged into the camera's entry of snapshots beside its capture health (the rig may
        run in another process than the camera's capture: then the entry holds only these)."""
        with self._lock:
            self.clocks[camera] = {"clock": state, "clock_offset_ms": offset_ms}

    def add_gauges(self, stage: str, gauges: Gauges) -> None:
        """Report `stage`'s own gauges: `gauges()` returns {name: number}, read at every
        snapshot (under stages.<stage>.gauges) and Prometheus scrape (npucam_stage_<name>
        with label stage). It may be called from any thread. Names: lower-case letters,
        digits and underscores, starting with a letter. Registering a stage again replaces
        its gauges."""
        if not stage:
            raise MetricsError("add_gauges: the stage name is empty")
        self.gauges[stage] = gauges

    def add_info(self, stage: str, info: dict[str, str]) -> None:
        """Report facts about `stage` that are not numbers (the infer stage: backend and
        pacing) in snapshots, under stages.<stage>.info; registering again replaces them."""
        if not stage:
            raise MetricsError("add_info: the stage name is empty")
        self.info[stage] = {str(k): str(v) for k, v in info.items()}

    def gauge_values(self, stage: str) -> dict[str, float]:
        """The current gauges of `stage` ({} if none); a failing or malformed gauge source is
        logged (once per stage and problem) and skipped, never raised: metrics must not take
        the stats topic or the Prometheus endpoint down."""
        fn = self.gauges.get(stage)
        if fn is None:
            return {}
        try:
            raw = dict(fn())
        except Exception as exc:
            self._warn_gauge(stage, "", f"gauges failed: {type(exc).__name__}: {exc}")
            return {}
        out: dict[str, float] = {}
        for name, value in raw.items():
            if not isinstance(name, str) or not GAUGE_NAME.match(name):
                self._warn_gauge(stage, name, f"gauge {name!r} is not a valid name (skipped)")
            elif name in RESERVED_GAUGE_NAMES:
                self._warn_gauge(stage, name, f"gauge {name!r} is a reserved name (skipped)")
            elif (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                self._warn_gauge(
                    stage, name, f"gauge {name!r}: {value!r} is not a finite number (skipped)"
                )
            else:
                out[name] = value
        return out

    def _warn_gauge(self, stage: str, name: object, problem: str) -> None:
        key = (stage, repr(name))
        if key not in self._bad_gauges:
            self._bad_gauges.add(key)
            log.warning("stage %s: %s", stage, problem)

    def dropped(
        self, stage: str | None = None, camera: str | None = None, reason: str | None = None
    ) -> int:
        """Total drops matching the given stage / camera / reason (None matches all)."""
        with self._lock:
            return sum(
                n
                for (s, c, r), n in self.drops.items()
                if (stage is None or s == stage)
                and (camera is None or c == camera)
                and (reason is None or r == reason)
            )

    def snapshot(self) -> dict:
        """Everything, as JSON-ready data: {"uptime_s", "stages": {...}, "cameras": {...}}."""
        with self._lock:
            stages: dict[str, dict] = {}

            def entry(stage: str) -> dict:
                return stages.setdefault(stage, {"in": {}, "out": {}, "drops": {}})

            for (stage, cam), n in self.items_in.items():
                entry(stage)["in"][cam] = n
            for (stage, cam), n in self.items_out.items():
                entry(stage)["out"][cam] = n
            for (stage, cam, reason), n in self.drops.items():
                entry(stage)["drops"].setdefault(cam, {})[reason] = n
            for stage, h in self.queue_wait.items():
                entry(stage)["queue_wait"] = h.summary_ms()
            for stage, h in self.work_time.items():
                entry(stage)["work"] = h.summary_ms()
            depths = dict(self.queue_depth)
            cameras = dict(self.cameras)
            clocks = {c: dict(v) for c, v in self.clocks.items()}
            gauged = list(self.gauges)
            for stage, info in self.info.items():
                entry(stage)["info"] = dict(info)
        for stage, depth in depths.items():
            entry(stage)["queue_depth"] = depth()
        for stage in gauged:
            entry(stage)["gauges"] = self.gauge_values(stage)
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "stages": stages,
            "cameras": {
                name: {
                    **(_camera_stats(name, cameras[name]) if name in cameras else {}),
                    **clocks.get(name, {}),
                }
                for name in {**cameras, **clocks}
            },
        }

    def prometheus_collector(self) -> PrometheusCollector:
        return PrometheusCollector(self)


def _camera_stats(name: str, stats: Callable[[], dict]) -> dict:
    try:
        return dict(stats())
    except Exception as exc:  # a camera's stats must never take the stats topic down
        log.warning("camera %s: stats failed: %s", name, exc)
        return {"health": "unknown", "last_error": str(exc)}


HEALTH_STATES = ("starting", "online", "stale", "reconnecting", "ended")


class PrometheusCollector:
    """prometheus_client collector that reads a Metrics object at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        m = self.metrics
        with m._lock:
            items_in = dict(m.items_in)
            items_out = dict(m.items_out)
            drops = dict(m.drops)
            hists = {
                "queue_wait": {s: _hist_copy(h) for s, h in m.queue_wait.items()},
                "work": {s: _hist_copy(h) for s, h in m.work_time.items()},
            }
        c_in = CounterMetricFamily(
            "npucam_stage_items_in", "Items a stage took", labels=["stage", "camera"]
        )
        for (s, c), n in items_in.items():
            c_in.add_metric([s, c], n)
        c_out = CounterMetricFamily(
            "npucam_stage_items_out", "Items a stage emitted", labels=["stage", "camera"]
        )
        for (s, c), n in items_out.items():
            c_out.add_metric([s, c], n)
        c_drop = CounterMetricFamily(
            "npucam_drops", "Items dropped, by reason", labels=["stage", "camera", "reason"]
        )
        for (s, c, r), n in drops.items():
            c_drop.add_metric([s, c, r], n)
        yield from (c_in, c_out, c_drop)
        for what, per_stage in hists.items():
            fam = HistogramMetricFamily(
                f"npucam_{what}_seconds",
                f"Per-stage {what.replace('_', ' ')} time",
                labels=["stage"],
            )
            for stage, (counts, total) in per_stage.items():
                cumulative, running = [], 0
                for bound, n in zip((*BUCKETS_S, float("inf")), counts, strict=True):
                    running += n
                    cumulative.append(("+Inf" if bound == float("inf") else str(bound), running))
                fam.add_metric([stage], cumulative, total)
            yield fam
        fps = GaugeMetricFamily(
            "npucam_camera_fps", "Frames per second at capture", labels=["camera"]
        )
        health = GaugeMetricFamily(
            "npucam_camera_health",
            "1 for the camera's current health state",
            labels=["camera", "state"],
        )
        for name, fn in list(m.cameras.items()):
            st = _camera_stats(name, fn)
            fps.add_metric([name], float(st.get("fps") or 0.0))
            for state in HEALTH_STATES:
                health.add_metric([name, state], 1.0 if st.get("health") == state else 0.0)
        yield from (fps, health)
        with m._lock:
            clocks = {c: v.get("clock_offset_ms") for c, v in m.clocks.items()}
        offset = GaugeMetricFamily(
            "npucam_camera_clock_offset_ms",
            "How far the camera's clock runs ahead of its rig's (ms), once judged",
            labels=["camera"],
        )
        for name, ms in clocks.items():
            if isinstance(ms, float):
                offset.add_metric([name], ms)
        yield offset
        families: dict[str, GaugeMetricFamily] = {}
        for stage in list(m.gauges):
            for name, value in m.gauge_values(stage).items():
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = GaugeMetricFamily(
                        f"npucam_stage_{name}", f"Stage gauge {name}", labels=["stage"]
                    )
                fam.add_metric([stage], float(value))
        yield from families.values()


def _hist_copy(h: Histogram) -> tuple[list[int], float]:
    return list(h.counts), h.total


def start_prometheus(metrics: Metrics, address: str):
    """Serve `metrics` as Prometheus text on http://HOST:PORT/metrics; returns the server.

    address: "HOST:PORT" (PORT 0 picks a free port; server.server_port tells which).
    """
    from prometheus_client import CollectorRegistry, start_http_server

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise MetricsError(f"prometheus address {address!r}: expected HOST:PORT")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.prometheus_collector())
    try:
        server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    except OSError as exc:
        raise MetricsError(f"prometheus address {address}: {exc}") from None
    return server
