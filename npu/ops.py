"""The op interface model forwards call: gemm and mha by key, with weights bound at load.

A forward is written once against these ops; `NumpyOps` runs them in float32 numpy (the cpu
backend, from HF checkpoints), and the device ops (xrt or sim) replay a bundle's kernels.
Every ops object names its backend so results can say which one produced them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.errors import NpucamError

EPILOGUES = ("none", "silu", "gelu", "swiglu")


class OpsError(NpucamError):
    """An op was called with a key or shape it was not bound for."""


@dataclass(frozen=True)
class GemmWeights:
    """One GEMM's weights. w: float32 [K, N]; bias: float32 [N] or None.

    epilogue: "silu" / "gelu" (exact erf) apply elementwise; "swiglu" splits the N columns
    into halves g | u and returns silu(g) * u ([rows, N/2]), as Sapiens2's fused gu GEMM.
    """

    w: np.ndarray
    bias: np.ndarray | None = None
    epilogue: str = "none"

    def __post_init__(self) -> None:
        if self.epilogue not in EPILOGUES:
            raise OpsError(f"unknown epilogue {self.epilogue!r}, expected one of {EPILOGUES}")
        if self.w.ndim != 2:
            raise OpsError(f"gemm weights must be [K, N], got shape {self.w.shape}")
        if self.bias is not None and self.bias.shape != (self.w.shape[1],):
            raise OpsError(f"bias shape {self.bias.shape} does not match N={self.w.shape[1]}")


class Ops(Protocol):
    """What a model forward needs from a backend."""

    backend: str

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        """a: float32 [rows, K] -> float32 [rows, N] (or N/2 for swiglu) of GEMM `key`."""
        ...

    def mha(
        self,
        key: str,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        scale: float,
        causal: bool = False,
    ) -> np.ndarray:
        """q, k, v: float32 [heads, S, d] -> float32 [heads, S, d] = softmax(scale·q·kᵀ)·v."""
        ...


def silu(x: np.ndarray) -> np.ndarray:
    """x·sigmoid(x), float32, without overflow warnings for large |x|."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorised erf (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7), computed in float64."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, as HF's `gelu` activation; float32 in, float32 out."""
    return (0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(np.float32)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool = False
) -> np.ndarray:
    """Reference softmax attention in float32. q, k, v: [heads, S, d] -> [heads, S, d]."""
    s = np.matmul(q, k.transpose(0, 2, 1)) * np.float32(scale)
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((s.shape[-2], n), dtype=bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v).astype(np.float32)


class NumpyOps:
    """The cpu backend: float32 numpy GEMMs and attention over weights bound by key."""

    backend = "cpu"

    def __init__(self, gemms: dict[str, GemmWeights]) -> None:
        self._gemms = dict(gemms)

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        try:
            gw = self._gemms[key]
        except KeyError:
            raise OpsError(f"gemm {key!r} is not bound on the cpu backend") from None
        if a.ndim != 2 or a.shape[1] != gw.w.shape[0]:
            raise OpsError(f"gemm {key!r}: A is {a.shape}, wanted [rows, {gw.w.shape[0]}]")
        c = np.matmul(a.astype(np.float32, copy=False), gw.w)
        if gw.bias is not None:
            c += gw.bias
        if gw.epilogue == "silu":
            c = silu(c)
        elif gw.epilogue == "gelu":
            c = gelu(c)
        elif gw.epilogue == "swiglu":
            half = c.shape[1] // 2
            c = silu(c[:, :half]) * c[:, half:]
        return c.astype(np.float32, copy=False)

    def mha(
        self,
        key: str,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        scale: float,
        causal: bool = False,
    ) -> np.ndarray:
        if q.ndim != 3 or k.shape != v.shape or q.shape[0] != k.shape[0]:
            raise OpsError(f"mha {key!r}: q {q.shape}, k {k.shape}, v {v.shape}")
        return attention(q, k, v, scale, causal)
