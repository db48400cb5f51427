"""CLIP labels changed while the infer stage runs ([stages.clip] labels_file), on the simulated
NPU with the synthetic CLIP (npu.models.synthetic).

Text-tower passes are counted at ClipTowers._text_pass (one pass per t_batch = 8 prompts), so
"computed once per label set" is checked on the device calls themselves, not the runtime's own
counters. The embeddings a result carries are compared with a fresh encoding of its labels.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from npu.models import ModelLoadError
from npu.models.clip.model import ClipTowers
from npu.models.loading import ModelSource
from npu.sim import SimDevice
from pipeline.config import parse_config
from pipeline.messages import now_ns
from stages.infer import Infer, InferOptions
from stages.jobs import Inferred
from stages.models.clip import runtime as runtimes
from stages.models.clip.job import ClipJob
from stages.models.clip.runtime import ClipOptions, LabelsFileError, read_labels_file
from stages.runtimes import open_runtime
from tests.stages.models.inferred_items import context as run_context

CONFIG_LABELS = ["a person", "a bicycle"]
SET_A = ["a person wearing a hard hat", "a person holding a phone", "a cyclist"]
SET_B = [f"a person with item {c}" for c in "abcdefghij"]  # 10 prompts: two text passes


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic-cache")


@pytest.fixture
def text_passes(monkeypatch):
    """Every text-tower pass on the device: the padded ids [8, 77] of each."""
    passes: list[np.ndarray] = []
    original = ClipTowers._text_pass

    def counting(self, ids):
        passes.append(np.array(ids))
        return original(self, ids)

    monkeypatch.setattr(ClipTowers, "_text_pass", counting)
    return passes


def write(path: Path, text: str | bytes, tick: list[int]) -> None:
    """Write the file and give it a fresh mtime (writes in one clock tick look unchanged)."""
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(data)
    tick[0] += 1_000_000_000
    os.utime(path, ns=(tick[0], tick[0]))


def sim_clip(device: SimDevice, cache: Path, **options):
    """The synthetic CLIP's runtime on the simulated device, with these [stages.clip] keys."""
    return open_runtime(
        "clip",
        "sim",
        ModelSource(synthetic=True),
        device=device,
        synthetic_cache=cache,
        options=ClipOptions(**options),
    )


def labels_text(labels: list[str]) -> str:
    return "# zero-shot labels\n\n" + "\n".join(f"  {label}  " for label in labels) + "\n"


def make_stage(tmp_path: Path, cache: Path, clip: dict) -> Infer:
    options = InferOptions.model_validate(
        {
            "backend": "sim",
            "synthetic_cache": str(cache),
            "sim": {"registry_dir": str(tmp_path / "hwctx"), "pacing": "none"},
            "clip": {"enabled": True, "synthetic": True, **clip},
        }
    )
    return Infer("infer", options, run_context(tmp_path))


IMAGE = np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)


def clip_job(seq: int) -> ClipJob:
    t = now_ns()
    return ClipJob(
        camera="c0",
        seq=seq,
        capture_ts_ns=t,
        deadline_ns=t + 60_000_000_000,
        box_xywh=np.array([0, 0, 160, 120], np.float32),
        image=IMAGE,
    )


class Recorder:
    def __init__(self) -> None:
        self.items: list[Inferred] = []

    async def send(self, item: Inferred) -> None:
        self.items.append(item)


async def results(out: Recorder, n: int) -> None:
    while len(out.items) < n:
        await asyncio.sleep(0.01)


def test_labels_file_changes_mid_run(tmp_path, cache, text_passes, monkeypatch, caplog):
    monkeypatch.setattr(runtimes, "LABELS_CHECK_S", 0.05)
    path = tmp_path / "labels.txt"
    tick = [1_700_000_000_000_000_000]
    write(path, labels_text(SET_A), tick)
    stage = make_stage(tmp_path, cache, {"labels": CONFIG_LABELS, "labels_file": "labels.txt"})
    out = Recorder()
    phases = [
        (None, SET_A),  # the file wins over the configured labels at startup
        (labels_text(SET_B), SET_B),
        (b"a person\n\xff\xfe broken\n", SET_B),  # not UTF-8 at line 2: kept
        ("# nothing\n\n   \n", SET_B),  # no labels: kept
        ("a person\n123\n", SET_B),  # a label without letters at line 2: kept
        (labels_text(SET_A), SET_A),  # back to A: cached, no text pass
    ]
    passes_after: list[int] = []

    async def source():
        while stage.scheduler is None:
            await asyncio.sleep(0.01)
        for i, (text, _) in enumerate(phases):
            if text is not None:
                write(path, text, tick)
                await asyncio.sleep(0.1)  # past LABELS_CHECK_S: the next glue stats the file
            for j in range(4):  # one full batch
                yield clip_job(4 * i + j)
            await results(out, 4 * (i + 1))
            passes_after.append(len(text_passes))

    with caplog.at_level(logging.ERROR, logger="stages.runtimes"):
        asyncio.run(asyncio.wait_for(stage.run(source(), out), timeout=60))

    assert len(out.items) == 4 * len(phases)
    for i, (_, expected) in enumerate(phases):
        for item in out.items[4 * i : 4 * i + 4]:
            assert item.extra["labels"] == expected, i
            assert item.extra["text_embeds"].shape == (len(expected), 64)
    # text passes: A once at startup (3 prompts, 1 pass), B once (10 prompts, 2 passes),
    # nothing for the bad files, nothing when A comes back; the config labels never encoded
    assert passes_after == [1, 3, 3, 3, 3, 3]
    rt = stage.runtimes["clip"]
    assert rt.label_errors == 3 and rt.label_sets_loaded == 2
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{path}:2: not UTF-8" in m for m in messages), messages
    assert any(f"{path}: no labels" in m for m in messages), messages
    assert any(f"{path}:2: label '123' has no letters" in m for m in messages), messages
    gauges = stage.model_gauges("clip")
    assert (gauges["label_sets_loaded"], gauges["label_file_errors"]) == (2, 3)
    # what a result carries is its labels' prompts' embeddings: a fresh encoding of them by the
    # same synthetic bundle on a new simulated device
    device = SimDevice(registry_dir=tmp_path / "hwctx2")
    try:
        ref = sim_clip(device, cache, labels=["x"])
        for i in (0, 1):
            prompts = [f"a photo of a {label}" for label in phases[i][1]]
            fresh = ref.model.encode_prompts(prompts)
            np.testing.assert_array_equal(out.items[4 * i].extra["text_embeds"], fresh)
        ref.close()
    finally:
        device.close()


def test_labels_file_polled_at_most_every_interval(tmp_path, cache, text_passes):
    path = tmp_path / "labels.txt"
    tick = [1_700_000_000_000_000_000]
    write(path, labels_text(SET_A), tick)
    device = SimDevice(registry_dir=tmp_path / "hwctx")
    try:
        rt = sim_clip(device, cache, labels=[], labels_file=str(path))
        assert rt.labels == SET_A and len(text_passes) == 1
        write(path, labels_text(SET_B), tick)
        t0 = rt.watch.next_check - runtimes.LABELS_CHECK_S
        assert not rt.poll_labels_file(now=t0 + 0.5)  # within the interval: not even stat'ed
        assert rt.poll_labels_file(now=t0 + 1.01)
        assert not rt.poll_labels_file(now=t0 + 2.1)  # unchanged stamp: not re-read
        assert rt.labels == SET_A  # swapped in by the device thread's next run, not the glue
        rt.apply_pending_labels()
        assert rt.labels == SET_B and rt.extra()["labels"] == SET_B and len(text_passes) == 3
        path.unlink()
        assert not rt.poll_labels_file(now=t0 + 3.2)
        assert rt.label_errors == 1 and "vanished" in rt.last_label_error
        rt.apply_pending_labels()
        assert rt.labels == SET_B
        rt.close()
    finally:
        device.close()


def test_startup_needs_labels_from_one_key(tmp_path, cache):
    device = SimDevice(registry_dir=tmp_path / "hwctx")
    missing = tmp_path / "nowhere.txt"
    try:
        with pytest.raises(ModelLoadError, match=f"{missing}: cannot read the labels file"):
            sim_clip(device, cache, labels_file=str(missing))
        rt = sim_clip(device, cache, labels=list(CONFIG_LABELS), labels_file=str(missing))
        assert rt.labels == CONFIG_LABELS and rt.label_errors == 1
        rt.close()
    finally:
        device.close()

    def problems(clip: dict) -> list[str]:
        config = parse_config(
            {
                "stages": [
                    {
                        "kind": "infer",
                        "backend": "sim",
                        "clip": {"enabled": True, "synthetic": True, **clip},
                    }
                ]
            },
            tmp_path / "x.toml",
        )
        return Infer.check(config, 0)

    assert any(p.startswith("stages[0].clip.labels: ") and "labels_file" in p
               for p in problems({}))  # fmt: skip
    assert any(p.startswith("stages[0].clip.labels_file: ") and "nowhere.txt" in p
               for p in problems({"labels_file": "nowhere.txt"}))  # fmt: skip
    (tmp_path / "ok.txt").write_text("a person\n")
    assert problems({"labels_file": "ok.txt"}) == []
    assert problems({"labels": CONFIG_LABELS, "labels_file": "nowhere.txt"}) == []


def test_read_labels_file(tmp_path):
    path = tmp_path / "l.txt"
    path.write_bytes("\ufeff# header\n\n  a person  \r\n#x\nun vélo\n\n".encode())
    assert read_labels_file(path) == [(3, "a person"), (5, "un vélo")]
    path.write_bytes(b"ok\nfine\n\xc3(\n")
    with pytest.raises(LabelsFileError, match=r"l\.txt:3: not UTF-8"):
        read_labels_file(path)
    path.write_bytes(b"")
    with pytest.raises(LabelsFileError, match=r"l\.txt: no labels"):
        read_labels_file(path)


class FailingEncoder:
    """Stands in for model.label_embeddings: raises each of `errors` in turn, then encodes."""

    def __init__(self, encode, errors: list[BaseException]) -> None:
        self.encode = encode
        self.errors = list(errors)
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, labels, template=None):
        self.calls.append(tuple(labels))
        if self.errors:
            raise self.errors.pop(0)
        return self.encode(labels, template)


def test_a_failed_label_encoding_keeps_the_labels_in_effect_and_is_retried(
    tmp_path, cache, monkeypatch, caplog
):
    # A device error, then any other exception, while encoding a new set: the set in effect
    # stays (labels and embeddings together), the new set stays queued, each failure is
    # counted and logged naming the file, and retries wait LABELS_CHECK_S, then twice that.
    from npu.device import DeviceError

    path = tmp_path / "labels.txt"
    tick = [1_700_000_000_000_000_000]
    write(path, labels_text(SET_A), tick)
    device = SimDevice(registry_dir=tmp_path / "hwctx")
    try:
        rt = sim_clip(device, cache, labels=[], labels_file=str(path))
        embeds_a = rt.text_embeds
        errors = [DeviceError("kernel finished in state 8"), RuntimeError("text tower broke")]
        encoder = FailingEncoder(rt.model.label_embeddings, errors)
        monkeypatch.setattr(rt.model, "label_embeddings", encoder)
        write(path, labels_text(SET_B), tick)
        assert rt.poll_labels_file(now=rt.watch.next_check)
        t0 = 100.0
        step = runtimes.LABELS_CHECK_S
        with caplog.at_level(logging.ERROR, logger="stages.runtimes"):
            assert rt.apply_pending_labels(now=t0) == 0.0  # DeviceError
            assert rt.labels == SET_A and rt.extra()["labels"] == SET_A
            assert rt.extra()["text_embeds"] is embeds_a
            assert rt.label_errors == 1 and "DeviceError: kernel finished" in rt.last_label_error
            rt.apply_pending_labels(now=t0 + 0.9 * step)  # before the retry: not attempted
            assert len(encoder.calls) == 1
            rt.apply_pending_labels(now=t0 + step)  # RuntimeError: not an NpucamError
            assert len(encoder.calls) == 2 and rt.labels == SET_A and rt.label_errors == 2
            assert "RuntimeError: text tower broke" in rt.last_label_error
            rt.apply_pending_labels(now=t0 + 2.9 * step)  # the wait doubled: not attempted
            assert len(encoder.calls) == 2
            assert rt.apply_pending_labels(now=t0 + 3 * step) >= 0.0
        assert encoder.calls == [tuple(SET_B)] * 3
        assert rt.labels == SET_B and rt.extra()["labels"] == SET_B
        assert rt.extra()["text_embeds"].shape == (len(SET_B), 64)
        assert rt.label_errors == 2 and rt.label_sets_loaded == 2
        messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(messages) == 2 and all(m.startswith(f"{path}: encoding") for m in messages)
        assert "keeping the 3 labels in effect" in messages[0]
        rt.apply_pending_labels(now=t0 + 10 * step)  # nothing queued any more
        assert len(encoder.calls) == 3
        rt.close()
    finally:
        device.close()


@pytest.mark.parametrize("error", [KeyboardInterrupt, asyncio.CancelledError, SystemExit])
def test_label_encoding_does_not_swallow_interrupts(tmp_path, cache, monkeypatch, error):
    path = tmp_path / "labels.txt"
    tick = [1_700_000_000_000_000_000]
    write(path, labels_text(SET_A), tick)
    device = SimDevice(registry_dir=tmp_path / "hwctx")
    try:
        rt = sim_clip(device, cache, labels=[], labels_file=str(path))
        encoder = FailingEncoder(rt.model.label_embeddings, [error()])
        monkeypatch.setattr(rt.model, "label_embeddings", encoder)
        write(path, labels_text(SET_B), tick)
        assert rt.poll_labels_file(now=rt.watch.next_check)
        with pytest.raises(error):
            rt.apply_pending_labels()
        assert rt.labels == SET_A and rt.label_errors == 0
        rt.apply_pending_labels()  # still queued: the next pass encodes it
        assert rt.labels == SET_B and len(encoder.calls) == 2
        rt.close()
    finally:
        device.close()


def test_a_failed_label_encoding_mid_run_fails_no_image_job(tmp_path, cache, monkeypatch):
    # In the stage: image batches keep publishing with the labels in effect while the new
    # set fails to encode, and the new set arrives once an encoding succeeds.
    monkeypatch.setattr(runtimes, "LABELS_CHECK_S", 0.05)
    path = tmp_path / "labels.txt"
    tick = [1_700_000_000_000_000_000]
    write(path, labels_text(SET_A), tick)
    stage = make_stage(tmp_path, cache, {"labels_file": "labels.txt"})
    out = Recorder()
    encoders: list[FailingEncoder] = []
    # each device pass: the seqs of its jobs and the encodings attempted by its end
    batches: list[tuple[list[int], int]] = []

    async def source():
        while stage.scheduler is None:
            await asyncio.sleep(0.01)
        rt = stage.runtimes["clip"]
        errors = [RuntimeError("text tower broke"), RuntimeError("text tower broke")]
        encoders.append(FailingEncoder(rt.model.label_embeddings, errors))
        rt.model.label_embeddings = encoders[0]
        run = rt.run

        def recording_run(prepared):
            try:
                return run(prepared)
            finally:
                batches.append(([job.seq for job in prepared.jobs], len(encoders[0].calls)))

        rt.run = recording_run
        write(path, labels_text(SET_B), tick)
        await asyncio.sleep(0.1)  # past LABELS_CHECK_S: the next glue reads the new file
        seq = 0
        while not out.items or out.items[-1].extra["labels"] != SET_B:
            assert seq < 200, "the new label set never came into effect"
            for _ in range(4):
                yield clip_job(seq)
                seq += 1
            while len(out.items) + stage.errors["clip"] < seq:
                await asyncio.sleep(0.01)
            assert stage.errors["clip"] == 0, stage.last_error  # no image job failed
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(stage.run(source(), out), timeout=60))
    rt = stage.runtimes["clip"]
    assert stage.errors["clip"] == 0
    assert [item.job.seq for item in out.items] == list(range(len(out.items)))
    switched = next(i for i, item in enumerate(out.items) if item.extra["labels"] == SET_B)
    # the first batch after the change kept SET_A (its encoding failed); the set changed
    # between batches, at the first whose encoding (the third) succeeded
    assert batches[0][1] == 1 and switched not in batches[0][0]
    assert switched == next(seqs[0] for seqs, encoded in batches if encoded == 3)
    assert all(item.extra["labels"] == SET_A for item in out.items[:switched])
    assert all(item.extra["labels"] == SET_B for item in out.items[switched:])
    assert rt.label_errors == 2 and encoders[0].calls == [tuple(SET_B)] * 3
