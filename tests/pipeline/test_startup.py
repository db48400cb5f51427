"""The start barrier (pipeline/startup.py): capture reads no frame until every stage that
opens slowly has opened, nor at all when one fails to open or the run stops first."""

from __future__ import annotations

import asyncio

from engine_stages import start, until

from pipeline.startup import Startup

CONFIG = """
[pipeline]
drain_timeout_s = 1.0
[[cameras]]
name = "cam"
url = "synthetic:?width=64&height=48&fps=100"
[[stages]]
kind = "capture"
[[stages]]
name = "model"
kind = "engine_stages:Opens"
fails = {fails}
inbox = {{ size = 1, policy = "latest" }}
"""


async def _turns(n: int = 20) -> None:
    """Let every task of the run take n turns of the loop (capture's would read by then)."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_capture_reads_once_the_slow_stage_has_opened(write_config):
    path = write_config(CONFIG.format(fails="false"))

    async def main():
        pipeline, task = await start(path)
        await _turns()
        model = pipeline.stages["model"]
        assert not pipeline.metrics.cameras  # capture has not opened its camera
        model.may_open.set()
        await until(lambda: len(model.items) >= 3 or task.done(), "3 frames at the model", 20)
        pipeline.stop()
        return model, await asyncio.wait_for(task, 10)

    model, code = asyncio.run(main())
    assert code == 0
    assert model.cameras_at_open == []  # no camera was open while the stage was opening
    assert len(model.items) >= 3  # and reading began once it had


def test_a_stage_that_fails_to_open_ends_the_run_before_any_frame_is_read(write_config, caplog):
    path = write_config(CONFIG.format(fails="true"))

    async def main():
        pipeline, task = await start(path)
        await _turns()
        pipeline.stages["model"].may_open.set()
        return pipeline, await asyncio.wait_for(task, 10)

    pipeline, code = asyncio.run(main())
    assert code == 1
    assert "stage model died: RuntimeError: opens: the model file is broken" in caplog.text
    assert not pipeline.metrics.cameras and pipeline.metrics.dropped() == 0


def test_a_run_stopped_while_a_stage_opens_ends_without_reading(write_config):
    path = write_config(CONFIG.format(fails="false"))

    async def main():
        pipeline, task = await start(path)
        await _turns()
        pipeline.stop()  # as SIGINT during the model load; the stage opens during the drain
        pipeline.stages["model"].may_open.set()
        return pipeline, await asyncio.wait_for(task, 10)

    pipeline, code = asyncio.run(main())
    assert code == 0 and not pipeline.metrics.cameras


def test_the_barrier_waits_for_every_expected_stage():
    async def main():
        startup = Startup()
        startup.expect("infer")
        startup.expect("detect")
        waiter = asyncio.ensure_future(startup.wait())
        startup.opened("detect")
        await _turns()
        pending = (waiter.done(), startup.opening)
        startup.opened("infer")
        await asyncio.wait_for(waiter, 1)
        return pending, startup.opening

    (done_early, opening), after = asyncio.run(main())
    assert (done_early, opening, after) == (False, ("infer",), ())
