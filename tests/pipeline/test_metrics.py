"""Metrics: counters and histograms in the stats snapshot and as Prometheus text."""

from __future__ import annotations

import asyncio
import functools
import threading
import urllib.request

import pytest
from engine_stages import start, until

from pipeline.clock import VirtualClock
from pipeline.messages import now_ns
from pipeline.metrics import Histogram, Metrics, MetricsError
from stages import capture
from stages.sources import CameraReader


def test_snapshot_groups_counts_by_stage_and_camera():
    m = Metrics()
    m.count_in("detect", "a", 3)
    m.count_out("detect", "a", 2)
    m.drop("detect", "a", "stale")
    m.drop("detect", "b", "npu_busy", 4)
    m.observe_work("detect", 0.004)
    m.add_camera("a", lambda: {"fps": 25.0, "health": "online"})
    snap = m.snapshot()
    stage = snap["stages"]["detect"]
    assert stage["in"] == {"a": 3} and stage["out"] == {"a": 2}
    assert stage["drops"] == {"a": {"stale": 1}, "b": {"npu_busy": 4}}
    assert stage["work"]["count"] == 1 and stage["work"]["p50_ms"] == 5.0  # bucket (2.5, 5] ms
    assert snap["cameras"]["a"] == {"fps": 25.0, "health": "online"}
    assert m.dropped(reason="npu_busy") == 4 and m.dropped(camera="a") == 1


def test_unknown_drop_reason_is_refused():
    with pytest.raises(MetricsError, match="drop reason 'oops'"):
        Metrics().drop("s", "a", "oops")


def test_histogram_quantiles_are_bucket_upper_bounds():
    h = Histogram()
    for s in [0.0002] * 90 + [0.3] * 10:
        h.observe(s)
    assert h.quantile(0.5) == 0.0005 and h.quantile(0.95) == 0.5 and h.count == 100


class PacedVirtualClock(VirtualClock):
    """A camera reader's clock whose monotonic time moves only by the waits the reader asks
    for, while each wait is also waited for real and frames are stamped on the host's clock:
    the camera streams at about its rate as on the system clock, but its grabs are exactly one
    period apart on the clock its fps is measured on, however loaded the host is."""

    def now_ns(self) -> int:
        return now_ns()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds)) or super().wait(event, seconds)


def test_prometheus_endpoint_serves_stage_and_camera_metrics(write_config, monkeypatch):
    path = write_config(
        """
        [metrics]
        stats_interval_s = 0
        prometheus = "127.0.0.1:0"
        [[cameras]]
        name = "card"
        url = "synthetic:?width=32&height=24&fps=50"
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "sink"
        kind = "engine_stages:Collect"
        """
    )
    # the fps the camera measures is on its reader's clock: a paced virtual one, so it is the
    # camera's 50 exactly (on the host's clock it is this host's speed)
    clock = PacedVirtualClock()
    monkeypatch.setattr(capture, "CameraReader", functools.partial(CameraReader, clock=clock))

    async def main():
        pipeline, task = await start(path)

        def streaming() -> bool:  # fps spans a few grabs, and the sink has taken frames
            card = pipeline.metrics.snapshot()["cameras"].get("card", {})
            return card.get("frames", 0) >= 5 and bool(pipeline.stages["sink"].items)

        try:
            await until(lambda: streaming() or task.done(), "the camera streaming", 20)
            assert not task.done(), "the run ended before the camera streamed"
            port = pipeline.prometheus_server.server_port
            url = f"http://127.0.0.1:{port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        finally:
            pipeline.stop()
        return await asyncio.wait_for(task, 10), text.decode()

    code, text = asyncio.run(main())
    assert code == 0
    assert 'npucam_stage_items_in_total{camera="card",stage="sink"}' in text
    assert 'npucam_queue_wait_seconds_bucket{le="+Inf",stage="sink"}' in text
    assert 'npucam_camera_health{camera="card",state="online"} 1.0' in text
    assert 'npucam_camera_fps{camera="card"} 50.0' in text  # the camera's own measure
    # paced at 50 fps: each wait the reader asked for was one period
    assert clock.waits and all(w == pytest.approx(1 / 50) for w in clock.waits), clock.waits


def _prometheus_text(m: Metrics) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(m.prometheus_collector())
    return generate_latest(registry).decode()


def test_stage_gauges_appear_in_the_snapshot_and_as_labelled_prometheus_gauges():
    m = Metrics()
    busy = {"device_busy_fraction": 0.25, "context_loads": 3}
    m.add_gauges("infer", lambda: busy)
    m.add_gauges("infer/clip", lambda: {"fill_ratio": 0.75})
    m.add_gauges("infer/pose", lambda: {"fill_ratio": 1.0})
    busy["device_busy_fraction"] = 0.5  # read at snapshot time, not at registration
    stages = m.snapshot()["stages"]
    assert stages["infer"]["gauges"] == {"device_busy_fraction": 0.5, "context_loads": 3}
    assert stages["infer/clip"]["gauges"] == {"fill_ratio": 0.75}
    text = _prometheus_text(m)
    assert "# TYPE npucam_stage_fill_ratio gauge" in text
    assert 'npucam_stage_fill_ratio{stage="infer/clip"} 0.75' in text
    assert 'npucam_stage_fill_ratio{stage="infer/pose"} 1.0' in text
    assert 'npucam_stage_device_busy_fraction{stage="infer"} 0.5' in text
    assert 'npucam_stage_context_loads{stage="infer"} 3.0' in text


def test_a_bad_gauge_source_is_skipped_and_logged_not_raised(caplog):
    m = Metrics()

    def broken():
        raise RuntimeError("device gone")

    m.add_gauges("a", broken)
    m.add_gauges(
        "b",
        lambda: {"ok": 1.5, "Bad-Name": 1, "items_in": 2, "text": "x", "flag": True,
                 "nan": float("nan")},
    )  # fmt: skip
    for _ in range(2):
        snap = m.snapshot()
        text = _prometheus_text(m)
    assert snap["stages"]["a"]["gauges"] == {}
    assert snap["stages"]["b"]["gauges"] == {"ok": 1.5}
    assert 'npucam_stage_ok{stage="b"} 1.5' in text and "Bad-Name" not in text
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "stage a: gauges failed: RuntimeError: device gone" in warnings
    assert any("gauge 'Bad-Name' is not a valid name" in w for w in warnings)
    assert any("gauge 'items_in' is a reserved name" in w for w in warnings)
    assert len(warnings) == 6  # once per stage and problem, not per read
    with pytest.raises(MetricsError, match="stage name is empty"):
        m.add_gauges("", dict)


def test_stage_info_appears_in_the_snapshot_as_strings():
    m = Metrics()
    m.add_info("infer", {"backend": "sim", "pacing": "npu2"})
    m.add_info("infer/clip", {"slots": 4})
    stages = m.snapshot()["stages"]
    assert stages["infer"]["info"] == {"backend": "sim", "pacing": "npu2"}
    assert stages["infer/clip"]["info"] == {"slots": "4"}
    with pytest.raises(MetricsError, match="stage name is empty"):
        m.add_info("", {})
