"""The Sapiens2 replay orders its dispatches as the amdxdna driver needs: a consumer on another
hardware context (o after the attention, down after gate-up) starts only once its producer was
seen to finish, since the driver orders runs within a context and not across them
(torvalds/linux drivers/accel/amdxdna/aie2_ctx.c; docs/device.md, "Ordering").

The recording fake pyxrt (tests/npu/fake_pyxrt.py) and the simulator both fault a run that
touches bytes an unseen run on another context writes; the old chaining, which started the
two launches of each pair before waiting, is replayed here by a step driver and fails on both.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from sapiens2_recording import fake_pyxrt
from sapiens2_torch_ref import tiny_sapiens2

from npu.device import DeviceError, Steps, run_steps, wait_all
from npu.models.sapiens2.checkpoint import from_pretrained
from npu.models.sapiens2.export import write_sim_bundle
from npu.models.sapiens2.npu import from_bundle
from stages.device_thread import Interleaved

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """The tiny model with a SwiGLU width past 512, so that down's K and so its context
    (flm.GEMM contexts are keyed by K, which the exporter pads to 512) differ from gu's, as
    at 0.4b."""
    path = tmp_path_factory.mktemp("s2order") / "tiny"
    tiny_sapiens2(0, intermediate_size=640).save_pretrained(path)
    return from_pretrained(path)


@pytest.fixture(scope="module")
def bundle(cpu, tmp_path_factory):
    return write_sim_bundle(cpu, tmp_path_factory.mktemp("s2order_b") / "b")


@pytest.fixture(scope="module")
def crops(cpu):
    cfg = cpu.config
    return np.random.default_rng(5).normal(size=(3, 3, cfg.H, cfg.W)).astype(np.float32)


@pytest.fixture
def sim(tmp_path):
    from npu.sim import SimDevice

    dev = SimDevice(registry_dir=tmp_path / "hwctx")
    yield dev
    dev.close()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(XrtDevice over the recording fake pyxrt, the fake module)."""
    from npu.xrt import XrtDevice

    mod = fake_pyxrt()
    monkeypatch.setitem(sys.modules, "pyxrt", mod)
    monkeypatch.delenv("TACONITE_CTX_CACHE", raising=False)
    node = tmp_path / "accel0"
    node.write_bytes(b"")
    dev = XrtDevice(str(node))
    yield dev, mod
    dev.close()


def run_chained(steps: Steps, producers: set[str]) -> object:
    """Drive steps as the old `_backbone` did: a step whose launches are all of kernels in
    `producers` is not waited for; the next step is started at once and both are waited for
    together (the old `[attention, o]` / `[gu, down]`)."""
    held: list = []
    try:
        launches = next(steps)
        while True:
            if launches and all(x.kernel.spec.key in producers for x in launches):
                held += launches
            else:
                try:
                    wait_all([*held, *launches])
                except BaseException:
                    steps.close()
                    raise
                held = []
            launches = steps.send(None)
    except StopIteration as stop:
        return stop.value


def _dispatches(cfg) -> int:
    return 1 + 5 * cfg.layers + len(cfg.up) + len(cfg.convs) + 1


@pytest.mark.parametrize(
    ("producer", "consumer", "buffer"), [("mha", "o", "ao"), ("gu", "down", "gu")]
)
def test_the_old_chaining_faults_on_the_fake_driver(
    bundle, crops, fake, producer, consumer, buffer
):
    dev, mod = fake
    model = from_bundle(bundle, dev)
    with pytest.raises(DeviceError, match="state 5"):  # ERT_CMD_STATE_ERROR
        run_chained(model.ops.heatmap_steps(crops[0]), {producer})
    first, kernels = mod.hazards[0], model.ops.kernels
    assert first.other_xclbin == str(kernels[producer].spec.xclbin)
    assert first.xclbin == str(kernels[consumer].spec.xclbin) != first.other_xclbin
    assert first.bo == model.ops.slots[0][buffer].root.bo.id
    assert "reads" in first.what and "writes" in first.what


def test_the_replay_runs_clean_on_the_fake_driver_with_per_context_device_times(
    bundle, crops, fake
):
    """Every context takes device time (the attention longest), so a consumer started early
    would find its producer still running: none is, and each layer's o / down begins after
    the run before it ended."""
    dev, mod = fake
    model = from_bundle(bundle, dev)
    mod.dispatch_s.update({"/mha.": 0.004, "/gemm_k": 0.001})
    cfg = model.config
    first = len(mod.timeline)
    out = model.heatmaps(crops[:1])
    assert out.shape == (1, cfg.K, *cfg.heatmap_size)
    assert mod.hazards == []
    spans = mod.timeline[first:]
    assert len(spans) == _dispatches(cfg)
    assert all(b[1] >= a[2] for a, b in zip(spans, spans[1:], strict=False))  # one at a time
    assert all(end > begin for _, begin, end in spans)


def test_boxes_interleaved_on_one_thread_share_no_bytes_across_contexts(bundle, crops, fake):
    """Three forwards in flight (npu.device.Interleaved, as the device thread runs them): their
    launches overlap on the fake's contexts, yet touch only their own slots' buffers."""
    dev, mod = fake
    model = from_bundle(bundle, dev)
    mod.dispatch_s.update({"/mha.": 0.002, "/gemm_k": 0.001})
    done: dict[int, tuple] = {}
    active = Interleaved()
    for i, crop in enumerate(crops):
        active.add(model.ops.heatmap_steps(crop, i), lambda r, e, i=i: done.__setitem__(i, (r, e)))
    while len(active):
        active.step()
    assert [e for _, e in done.values()] == [None] * 3
    assert mod.hazards == []
    assert len(mod.timeline) == 3 * _dispatches(model.config)


def test_the_old_chaining_is_a_named_error_on_the_sim(bundle, crops, sim):
    model = from_bundle(bundle, sim)
    with pytest.raises(DeviceError) as err:
        run_chained(model.ops.heatmap_steps(crops[0]), {"mha"})
    msg = str(err.value)
    assert msg.count("manifest.txt:") == 2 and ": o reads bytes" in msg
    assert "that mha (" in msg and "another hardware context" in msg
    with pytest.raises(DeviceError, match=r": down reads bytes .* that gu \("):
        run_chained(from_bundle(bundle, sim).ops.heatmap_steps(crops[0]), {"gu"})


def test_interleaved_boxes_on_the_sim_match_one_at_a_time(bundle, crops, sim):
    model = from_bundle(bundle, sim)
    want = [run_steps(model.ops.heatmap_steps(c)) for c in crops]
    done: dict[int, np.ndarray] = {}
    active = Interleaved()
    for i, crop in enumerate(crops):
        active.add(model.ops.heatmap_steps(crop, i), lambda r, e, i=i: done.__setitem__(i, r))
    while len(active):
        active.step()
    for i, hm in enumerate(want):
        np.testing.assert_array_equal(done[i], hm)
