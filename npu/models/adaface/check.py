"""taconite-adaface's run_ir18 / run_ir101 self-check of a bundle on a device: replay vs the
recorder's embedding, embed() vs the replay, and the replay vs the fp32 CPU reference
(docs/adaface-bundle.md); the report is data, the CLI prints it."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npu.bundle import Bundle
from npu.device import Device
from npu.models.adaface.npu import AdafaceBundle, Shape
from npu.models.adaface.post import cosine
from pipeline.errors import NpucamError

PASS_COSINE = 0.99  # run_ir18's "RESULT: MATCH" gate


@dataclass
class CheckReport:
    """What check_bundle found. Cosines are None when the bundle lacks the reference tensor;
    error is set (and passed False) when the bundle or the device failed."""

    bundle: str
    backend: str = ""
    model: str | None = None
    dispatches: int = 0
    conv_kernels: int = 0
    input_dims: Shape | None = None
    embed_dim: int = 0
    reps: int = 0
    cold_s: float = 0.0
    warm_s: float | None = None  # mean of reps 2.. (contexts resident)
    cos_recorder: float | None = None  # replay vs ref.npu_embedding
    recorder_identical: bool = False
    cos_api: float | None = None  # embed(ref.input_chw) vs the recorded replay
    api_identical: bool = False
    cos_cpu: float | None = None  # replay vs ref.cpu_embedding
    error: str | None = None
    device_note: str = ""

    @property
    def passed(self) -> bool:
        """No error and cos(replay, ref.cpu_embedding) > 0.99: the one cosine taconite's
        cli_run decides on (lib.rs @2f59ad4); the others are information."""
        return self.error is None and self.cos_cpu is not None and self.cos_cpu > PASS_COSINE

    def text(self) -> str:
        """The printable report (run_ir18's lines, plus what npucam adds)."""
        lines = [f"bundle: {self.bundle}"]
        if self.input_dims is not None:
            c, h, w = self.input_dims
            lines += [
                f"{self.model or 'IR'} forward: {self.dispatches} conv dispatches "
                f"({self.conv_kernels} distinct kernels) on the {self.backend} device + CPU head",
                f"input: {c}x{h}x{w}, embedding: {self.embed_dim} dims",
            ]
        if self.reps:
            where = "host wall clock" + (
                ", simulated device: not NPU time" if self.backend == "sim" else ""
            )
            if self.warm_s is None:
                lines.append(f"latency: {1e3 * self.cold_s:.0f} ms ({where})")
            else:
                lines.append(
                    f"latency: cold {1e3 * self.cold_s:.0f} ms, warm {1e3 * self.warm_s:.0f} ms "
                    f"(mean of {self.reps - 1} reps; contexts resident; {where})"
                )
        if self.device_note:
            lines.append(self.device_note)

        def cos_line(label: str, value: float | None, identical: bool, missing: str) -> str:
            if value is None:
                return f"{label} = n/a ({missing} not in the bundle)"
            return f"{label} = {value:.5f}" + (" (bit-identical)" if identical else "")

        if self.error is None:
            lines += [
                cos_line(
                    "cosine(replay, recorder embedding)  ",
                    self.cos_recorder,
                    self.recorder_identical,
                    "ref.npu_embedding",
                ),
                cos_line(
                    "cosine(embed() API, recorded replay)",
                    self.cos_api,
                    self.api_identical,
                    "ref.input_chw",
                ),
                cos_line("cosine(replay, CPU reference)       ", self.cos_cpu, False,
                         "ref.cpu_embedding"),
            ]  # fmt: skip
        else:
            lines.append(f"error: {self.error}")
        if self.passed:
            lines.append(
                "RESULT: MATCH (cosine(replay, CPU reference) > 0.99; the other cosines are "
                "information)"
            )
        elif self.error is not None:
            lines.append("RESULT: FAIL (the bundle could not be checked)")
        elif self.cos_cpu is None:
            lines.append("RESULT: FAIL (no ref.cpu_embedding to compare with)")
        else:
            lines.append("RESULT: MISMATCH (cosine(replay, CPU reference) <= 0.99)")
        return "\n".join(lines)


def _reference(bundle: Bundle, name: str, elems: int | None) -> np.ndarray | None:
    """An f32 reference tensor (None if absent); elems checks its size when given."""
    if not bundle.has(name):
        return None
    if elems is None:
        return bundle.f32(name).reshape(-1)
    return np.asarray(bundle.view(bundle.expect(name, "f32", elems).name, "f32"), np.float32)


def check_bundle(path: str | Path, device: Device, reps: int = 1) -> CheckReport:
    """taconite's run_ir18 / run_ir101 self-check of the bundle at `path` on `device`:
    `reps` forwards of embed_recorded() (timed), then the replay vs ref.npu_embedding,
    embed(ref.input_chw) vs the replay, and the replay vs ref.cpu_embedding. Passes when
    cos(replay, ref.cpu_embedding) > 0.99, as taconite's cli_run decides (npucam also exits
    1 otherwise, where taconite prints the RESULT line and exits 0). Never raises for a bad
    bundle or device: the report carries the error."""
    report = CheckReport(str(path), backend=getattr(device, "backend", "?"))
    model: AdafaceBundle | None = None
    try:
        model = AdafaceBundle.load(path, device)
        report.model = model.model()
        report.dispatches = model.num_conv_dispatches()
        report.conv_kernels = model.num_conv_kernels()
        report.input_dims = model.input_dims()
        report.embed_dim = model.embed_dim()
        n = report.embed_dim
        times = []
        replay = np.zeros(0, np.float32)
        for _ in range(max(1, reps)):
            t0 = time.perf_counter()
            replay = model.embed_recorded()
            times.append(time.perf_counter() - t0)
        report.reps = len(times)
        report.cold_s = times[0]
        if len(times) > 1:
            report.warm_s = sum(times[1:]) / (len(times) - 1)
        sim = getattr(device, "sim", None)
        if sim is not None:
            report.device_note = (
                f"simulated device time so far: {sim.device_time_s:.3f} s "
                f"({sim.creations} context creations, {sim.switches} switches; a model)"
            )
        npu_ref = _reference(model.bundle, "ref.npu_embedding", n)
        if npu_ref is not None:
            report.cos_recorder = cosine(replay, npu_ref)
            report.recorder_identical = bool(np.array_equal(replay, npu_ref))
        chw = _reference(model.bundle, "ref.input_chw", None)
        if chw is not None:
            api = model.embed(chw)
            report.cos_api = cosine(api, replay)
            report.api_identical = bool(np.array_equal(api, replay))
        cpu_ref = _reference(model.bundle, "ref.cpu_embedding", n)
        if cpu_ref is not None:
            report.cos_cpu = cosine(replay, cpu_ref)
    except NpucamError as exc:
        report.error = str(exc)
    finally:
        if model is not None:
            model.close()
    return report


def reps_from_env(environ: Mapping[str, str] | None = None) -> int:
    """`$NREPS` as run_ir18 reads it: a usize (Rust's parse), else 1; at least 1."""
    raw = (os.environ if environ is None else environ).get("NREPS", "")
    return max(1, int(raw)) if re.fullmatch(r"\+?[0-9]+", raw) else 1
