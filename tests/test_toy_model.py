"""A fourth model plugs in with one registry entry and no edit to npucam: the toy package
(tests/toymodel: spec, model, runtime, stages) runs source -> infer -> postprocess -> publish
on the simulated NPU, and a subscriber gets its `toy/<camera>` messages with the values a
numpy forward of the same weights gives (within bf16 rounding of A and C: the device rounds
its input and output to bf16, relative error <= 2^-8 each, so 2e-2 absolute on these
O(1) values)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_stages import receive, start, subscriber

from npu import models
from pipeline.wire import decode
from tests.toymodel import MODEL
from tests.toymodel.model import weights, write_bundle
from tests.toymodel.runtime import toy_input
from tests.toymodel.stages import toy_frame


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
        got = await receive(sub, until_idle_s=3.0)
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
