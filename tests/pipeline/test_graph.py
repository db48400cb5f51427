"""The graph runner: queue policies end to end, per-item errors, dying stages, shutdown."""

from __future__ import annotations

import asyncio
import time

from engine_stages import run_and_receive, start

from pipeline import wire

SYNTHETIC = "synthetic:?width=64&height=48&fps={fps}"


def test_drop_oldest_behind_a_slow_stage_keeps_lag_under_budget_and_counts_drops(write_config):
    budget_ms = 300
    path = write_config(
        f"""
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "fast"
        url = "{SYNTHETIC.format(fps=60)}"
        staleness_ms = {budget_ms}
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "model"
        kind = "engine_stages:Slow"
        delay_s = 0.05
        inbox = {{ size = 2, policy = "drop_oldest" }}
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        inbox = {{ size = 4, policy = "drop_oldest" }}
        """
    )

    pipeline, code, raw = run_and_receive(path, duration=2.0, topic="det/", until_idle_s=1.5)
    messages = [wire.decode(m) for m in raw]
    assert code == 0
    lags_ms = [(m.header["publish_ts"] - m.header["capture_ts"]) / 1e6 for m in messages]
    assert len(messages) >= 15  # ~20 fps through the slow stage for ~1.5 s
    assert max(lags_ms) < budget_ms, lags_ms
    seqs = [m.header["seq"] for m in messages]
    assert seqs == sorted(set(seqs))
    # 60 fps into a 20 fps stage: about two frames of three are dropped at its inbox
    assert pipeline.metrics.dropped("model", "fast", "queue_full") > len(messages)


def test_block_policy_on_a_file_loses_nothing(write_config, make_clip):
    clip = make_clip("clip.avi", frames=40)
    path = write_config(
        f"""
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "file"
        url = "{clip.name}"
        realtime = false
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "model"
        kind = "engine_stages:Slow"
        delay_s = 0.005
        inbox = {{ size = 2, policy = "block" }}
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        inbox = {{ size = 2, policy = "block" }}
        """
    )

    pipeline, code, raw = run_and_receive(path, topic="det/file", stop_within_s=10)
    messages = [wire.decode(m) for m in raw]
    assert code == 0  # the file ended, the pipeline drained and stopped by itself
    assert [m.header["seq"] for m in messages] == list(range(40))
    assert pipeline.metrics.dropped() == 0


def test_a_stage_raising_on_one_item_counts_error_and_goes_on(write_config, make_clip):
    clip = make_clip("clip.avi", frames=10)
    path = write_config(
        f"""
        [[cameras]]
        name = "file"
        url = "{clip.name}"
        realtime = false
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "engine_stages:Flaky"
        inbox = {{ size = 2, policy = "block" }}
        [[stages]]
        name = "sink"
        kind = "engine_stages:Collect"
        inbox = {{ size = 2, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(path)
        return pipeline, await asyncio.wait_for(task, 10)

    pipeline, code = asyncio.run(main())
    assert code == 0
    assert [f.seq for f in pipeline.stages["sink"].items] == [0, 2, 4, 6, 8]
    assert pipeline.metrics.dropped("engine_stages:Flaky", "file", "error") == 5


def test_a_dying_stage_ends_the_pipeline_with_exit_1_and_names_it(write_config, caplog):
    path = write_config(
        f"""
        [pipeline]
        drain_timeout_s = 1.0
        [[cameras]]
        name = "cam"
        url = "{SYNTHETIC.format(fps=100)}"
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "broken"
        kind = "engine_stages:Dies"
        inbox = {{ size = 2, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(path, duration=30)
        return await asyncio.wait_for(task, 10)

    t0 = time.monotonic()
    code = asyncio.run(main())
    assert code == 1
    # wall-clock-ok: a hang guard: without the death the run lasts its 30 s duration
    assert time.monotonic() - t0 < 10
    assert "stage broken died: RuntimeError: dies: the stage's loop broke" in caplog.text


def test_stop_drains_in_flight_items_and_ends_with_0(write_config):
    path = write_config(
        f"""
        [[cameras]]
        name = "cam"
        url = "{SYNTHETIC.format(fps=200)}"
        staleness_ms = 60000
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "model"
        kind = "engine_stages:Slow"
        delay_s = 0.01
        inbox = {{ size = 8, policy = "block" }}
        [[stages]]
        name = "sink"
        kind = "engine_stages:Collect"
        inbox = {{ size = 8, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(path)
        await asyncio.sleep(0.5)
        pipeline.stop()
        return pipeline, await asyncio.wait_for(task, 5)

    pipeline, code = asyncio.run(main())
    assert code == 0
    seqs = [f.seq for f in pipeline.stages["sink"].items]
    emitted = pipeline.metrics.items_out["capture", "cam"]
    # every frame the capture stage handed on before stopping reached the end, in order
    assert seqs == list(range(emitted))
    assert pipeline.metrics.dropped() == 0
