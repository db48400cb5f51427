"""The toy model: x float32 [3, 8, 8] -> x.flat @ W[:192, :4] (W float32 [512, 128], rows
past 192 zero): numpy on cpu, one `gemm` dispatch on a device (sim or npu) from its bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from npu.bundle import Bundle
from npu.bundle_writer import BundleWriter
from npu.ops import DeviceOps
from npu.sim_bundle import write_gemm, write_xclbin

K, N, OUT = 512, 128, 4  # the GEMM's padded shape and the outputs kept


def weights(seed: int = 4) -> np.ndarray:
    """The toy's B, float32 [K, N]: rows past the 192 inputs are zero."""
    w = np.zeros((K, N), np.float32)
    w[:192] = np.random.default_rng(seed).standard_normal((192, N)).astype(np.float32) * 0.1
    return w


def write_bundle(path: Path, w: np.ndarray) -> Path:
    """A one-record bundle the simulator runs: `gemm toy` with B = w."""
    with BundleWriter(path, 1) as bw:
        write_xclbin(bw, "gemm")
        write_gemm(bw, "toy", w, ctx="gemm")
    return path


class ToyModel:
    """`apply(x)`: float32 [3, 8, 8] -> float32 [4], on numpy or on a device."""

    def __init__(self, w: np.ndarray | None, ops: DeviceOps | None = None) -> None:
        self.w, self.ops = w, ops

    @classmethod
    def from_weights(cls, path: Path) -> ToyModel:
        return cls(np.load(path / "w.npy"))

    @classmethod
    def from_bundle(cls, path: Path, device: Any) -> ToyModel:
        bundle = Bundle.open(path)
        return cls(None, DeviceOps.from_bundle(device, bundle, gemms={"toy": ("toy", "toy.b")}))

    def apply(self, x: np.ndarray) -> np.ndarray:
        a = np.zeros((1, K), np.float32)
        a[0, :192] = np.asarray(x, np.float32).reshape(-1)
        c = a @ self.w if self.ops is None else self.ops.gemm("toy", a)
        return c[0, :OUT].astype(np.float32)
