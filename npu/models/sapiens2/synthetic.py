"""The synthetic Sapiens2-Pose: 308 keypoints from a 256 x 192 crop (64 x 48 heatmaps), 2 blocks
of width 64, random weights from a fixed seed (npu.models.synthetic); its outputs mean nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npu.models.sapiens2.config import Config
from npu.models.sapiens2.model import KeyedOps, Sapiens2Pose, gemm_shapes, rope_tables
from npu.models.synthetic import normal
from npu.ops import GemmWeights, NumpyOps

MODEL_ID = "sapiens2-synthetic"
VERSION = 3  # bump when the model or bundle layout changes (cached bundles are rebuilt)
SEED = 20
KEYPOINTS = 308


def config() -> Config:
    """The tiny Sapiens2 config: 256 x 192 crops, patch 16, 2 blocks of width 64, K = 308."""
    return Config(
        D=64, I=128, layers=2, heads=4, hd=16, kv_heads=(4, 2), regs=2, patch=16, H=256, W=192,
        eps=1e-6, in_eps=1e-5, up=(32, 32), convs=(32,), K=KEYPOINTS,
    )  # fmt: skip


def build(seed: int = SEED) -> Sapiens2Pose:
    """The tiny Sapiens2-Pose on the cpu backend, with its float32 weights."""
    cfg = config()
    rng = np.random.default_rng(seed)
    gemms = {}
    for key, (k, n) in gemm_shapes(cfg).items():
        epilogue = "swiglu" if key.endswith(".gu") else "none"
        cols = 2 * n if epilogue == "swiglu" else n
        bias = None if key.startswith("d") else normal(rng, cols, scale=0.02)
        gemms[key] = GemmWeights(normal(rng, k, cols, scale=k**-0.5), bias, epilogue)
    cos, sin = rope_tables(cfg)
    host = {"prefix": normal(rng, cfg.prefix * cfg.D, scale=0.5)}
    host["rope.cos"], host["rope.sin"] = cos.reshape(-1), sin.reshape(-1)
    for i in range(cfg.layers):
        host[f"{i}.q_norm"] = 1.0 + normal(rng, cfg.hd, scale=0.1)
        host[f"{i}.k_norm"] = 1.0 + normal(rng, cfg.hd, scale=0.1)
    return Sapiens2Pose(cfg, KeyedOps(NumpyOps(gemms), cfg), host, weights=gemms)


def cpu(cache: str | Path | None = None) -> Sapiens2Pose:
    return build()


def write_bundle(out: Path, cache: str | Path | None = None) -> Path:
    from npu.models.sapiens2.export import write_sim_bundle

    return write_sim_bundle(build(), out)
