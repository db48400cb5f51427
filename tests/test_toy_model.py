"""A fourth model plugs in with one registry entry and no edit to npucam: the toy package
(tests/toymodel: spec, model, runtime, stages) runs source -> infer -> postprocess -> publish
on the simulated NPU, and a subscriber gets its `toy/<camera>` messages with the values a
numpy forward of the same weights gives (within bf16 rounding of A and C: the device rounds
its input and output to bf16, relative error <= 2^-8 each, so 2e-2 absolute on these
O(1) values). Declared to run on tracked persons, it also runs from a sample clip through
capture, detect and infer, a result per tracked person of each frame, at the rate
`npucam plan` predicts."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from engine_stages import receive_until_done, start, subscriber

from npu import models
from pipeline.wire import decode
from stages.planning import plan as plan_module
from stages.planning.plan import make_plan
from tests.toymodel import MODEL
from tests.toymodel.model import weights, write_bundle
from tests.toymodel.runtime import toy_input
from tests.toymodel.stages import toy_frame

pytestmark = pytest.mark.heavy  # a whole pipeline run (tests/conftest.py)


@pytest.fixture
def toy_registered():
    models.register(MODEL)
    yield
    models.unregister(MODEL.name)


def test_a_toy_fourth_model_runs_through_infer_and_publish_on_sim(
    toy_registered, tmp_path, write_config
):
    w = weights()
    write_bundle(tmp_path / "toy-bundle", w)
    config = write_config(
        f"""
        [[cameras]]
        name = "toycam"
        url = "synthetic:"

        [[stages]]
        name = "source"
        kind = "tests.toymodel.stages:ToySource"
        frames = 6

        [[stages]]
        name = "infer"
        kind = "infer"
        backend = "sim"
        inbox = {{ size = 16, policy = "block" }}
        [stages.sim]
        pacing = "none"
        registry_dir = "{tmp_path / "hwctx"}"
        [stages.toy]
        enabled = true
        bundle = "toy-bundle"
        cost_s = 0.01

        [[stages]]
        name = "post"
        kind = "tests.toymodel.stages:ToyPost"
        inbox = {{ size = 16, policy = "block" }}

        [[stages]]
        name = "publish"
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        stats = false
        wait_for_subscribers = 1
        inbox = {{ size = 16, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(config)
        sub = await subscriber(pipeline, topic="toy/")
        got = await receive_until_done(sub, task)
        code = await task
        sub.close()
        return pipeline, code, got

    pipeline, code, got = asyncio.run(main())
    assert code == 0
    messages = sorted((decode(parts) for parts in got), key=lambda m: m.header["seq"])
    assert [m.header["seq"] for m in messages] == list(range(6))
    for m in messages:
        assert m.topic == "toy/toycam"
        assert m.header["backend"] == "sim" and m.header["model"] == "toy-bundle"
        want = toy_input(toy_frame(40 * m.header["seq"])).reshape(-1) @ w[:192, :4]
        np.testing.assert_allclose(m.arrays["values"], want, atol=2e-2)
    assert pipeline.stages["infer"].stats()["runtimes"]["toy"]["published"] == 6


FPS = 50.0  # paced at twice bikes.mp4's own 25 fps: the run lasts 5 s of its 250 frames


def test_the_toy_runs_on_tracked_persons_from_a_sample_clip_and_plan_predicts_its_rate(
    toy_registered, tmp_path, write_config, monkeypatch
):
    """capture -> detect -> infer -> post -> publish on sim with nothing but the toy's package
    and its registry entry: detect makes a ToyJob per tracked person of each frame (the toy
    declares RunsOn("person", "frame")), and every frame's persons come back on toy/bikes.
    `npucam plan` (make_plan, in process) predicts its rate within 15% of the run. Neither
    side depends on this host's speed: `block` inboxes drop nothing, so the run's rate at
    the file's pace is its results per frame x the configured fps (a loaded host only
    stretches when the frames are grabbed), and the plan's scenes are measured with detect
    priced at 10 ms a frame (it keeps up at 50 fps) instead of this host's time, so both
    count what detect finds in the same frames; the toy's pass is priced by its cost_s."""
    write_bundle(tmp_path / "toy-bundle", weights())
    config = write_config(
        f"""
        [[cameras]]
        name = "bikes"
        url = "sample:bikes.mp4"
        fps = {FPS}
        staleness_ms = 600000

        [[stages]]
        kind = "capture"

        [[stages]]
        kind = "detect"
        to = ["infer", "publish"]
        face = "none"
        inbox = {{ size = 8, policy = "block" }}

        [[stages]]
        kind = "infer"
        backend = "sim"
        to = ["post"]
        inbox = {{ size = 64, policy = "block" }}
        [stages.sim]
        pacing = "none"
        registry_dir = "{tmp_path / "hwctx"}"
        [stages.toy]
        enabled = true
        bundle = "toy-bundle"
        cost_s = 0.01
        queue_size = 64

        [[stages]]
        name = "post"
        kind = "tests.toymodel.stages:ToyPost"
        to = ["publish"]
        inbox = {{ size = 64, policy = "block" }}

        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        stats = false
        wait_for_subscribers = 1
        inbox = {{ size = 256, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(config)
        sub = await subscriber(pipeline)
        got = await receive_until_done(sub, task)
        code = await task
        sub.close()
        return pipeline, code, got

    pipeline, code, got = asyncio.run(main())
    assert code == 0
    messages = [decode(parts) for parts in got]
    frames = [m for m in messages if m.topic == "det/bikes"]
    toys = [m for m in messages if m.topic == "toy/bikes"]
    assert [m.header["seq"] for m in frames] == list(range(250))
    people = sum(
        1
        for m in frames
        for label, track in zip(m.header["labels"], m.header["track_ids"], strict=True)
        if label == "person" and track is not None
    )
    assert len(toys) == people > 0  # a result per tracked person of every frame
    assert pipeline.stages["infer"].stats()["runtimes"]["toy"]["published"] == people
    ran = len(toys) / len(frames) * FPS

    measure = plan_module.measure_scenes
    monkeypatch.setattr(
        plan_module,
        "measure_scenes",
        lambda *a, **kw: {
            n: dataclasses.replace(sc, detect_s=0.010) for n, sc in measure(*a, **kw).items()
        },
    )
    plan = make_plan(str(config), frames=250)
    predicted = plan.results["toy"]
    assert predicted == pytest.approx(ran, rel=0.15), (predicted, ran, plan.cameras[0])
