"""Writes a cpu-backend Sapiens2-Pose as a bundle the simulated NPU runs (docs/pose.md,
docs/bundles.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from npu.models.sapiens2.config import Config, ModelError
from npu.models.sapiens2.model import Sapiens2Pose
from npu.models.sapiens2.npu import _round_up, gemm_record_keys
from npu.ops import GemmWeights

GEMM_K_ALIGN = 512  # flm.GEMM's K % 512 (docs/device.md)


GEMM_N_ALIGN = 128  # a multiple of every tile_n


def _pad_gemm(gw: GemmWeights) -> tuple[np.ndarray, np.ndarray | None]:
    """B [K, N] and bias zero-padded to K % 512 and N % 128 (swiglu pads each half)."""
    k, n = gw.w.shape
    kp = _round_up(k, GEMM_K_ALIGN)
    halves = 2 if gw.epilogue == "swiglu" else 1
    hp = _round_up(n // halves, GEMM_N_ALIGN // halves)
    w = np.zeros((kp, hp * halves), np.float32)
    b = None if gw.bias is None else np.zeros(hp * halves, np.float32)
    for h in range(halves):
        cols = slice(h * (n // halves), (h + 1) * (n // halves))
        w[:k, h * hp : h * hp + n // halves] = gw.w[:, cols]
        if b is not None:
            b[h * hp : h * hp + n // halves] = gw.bias[cols]
    return w, b


REF_TENSORS = {
    "rgb": "u8", "box": "f32", "pixels": "f32", "features": "bf16", "heatmaps": "bf16",
    "keypoints": "f32", "scores": "f32",
}  # fmt: skip


def write_sim_bundle(
    model: Sapiens2Pose,
    path: str | Path,
    version: int = 1,
    flip_pairs: str = "",
    refs: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    strided: bool = False,
) -> Path:
    """Write a cpu-backend model as a bundle the simulated NPU runs; returns its directory.

    Records follow docs/pose.md (gemm keys patch, qkv<width>, o, gu, down, d<j>, c<j>, pred; one
    mha), weights are packed with npu.sim.pack_gemm_b (bfp16ebs8, bias as bf16 after it), and
    host tensors are f32. IRON's real packing is unpublished (docs/pose.md), so B and
    A are zero-padded here to flm.GEMM's K % 512 and N % 128; the host pads A and drops the
    extra C columns. version 2 leaves the down and deconv biases to the host.
    refs: validation cases {name: {rgb uint8 [h, w, 3], box [4], pixels [3, H, W], features
    [gh*gw, D], heatmaps [K, Hh, Wh], keypoints [K, 2], scores [K]}} written as docs/pose.md's
    `ref <name> w= h=` records and ref.<name>.* tensors.
    strided: write the head's records in taconite-sapiens2's strided form (docs/pose.md):
    d<j> reads A at lda = 2C with K = 4C (zero-padded to K % 512; the padding rows of B are
    zero) over rows = (h0+1)(w0+2); c<j> and pred write C at c_stride = N + 128 > N (so the
    host's crop to C_out is exercised); all with rows, a_elems and c_elems.
    """
    from npu.bundle_writer import BundleWriter
    from npu.sim import (
        CT_MAX_K_FOR_N,
        pack_gemm_b,
        strided_gemm_fields,
        write_mha,
        write_xclbin,
    )

    cfg, gemms = model.config, model.weights
    if gemms is None:
        raise ModelError("write_sim_bundle needs a model loaded with its float32 weights")
    records = gemm_record_keys(cfg)
    strides = _head_strides(cfg) if strided else {}
    host = dict(model.host)
    with BundleWriter(path, version) as bw:
        for name, value in (
            ("D", cfg.D), ("I", cfg.I), ("layers", cfg.layers), ("heads", cfg.heads),
            ("hd", cfg.hd), ("kv_heads", ",".join(map(str, cfg.kv_heads))), ("regs", cfg.regs),
            ("patch", cfg.patch), ("H", cfg.H), ("W", cfg.W), ("eps", cfg.eps),
            ("in_eps", cfg.in_eps), ("up", ",".join(map(str, cfg.up))),
            ("convs", ",".join(map(str, cfg.convs))), ("K", cfg.K), ("box_pad", cfg.box_pad),
            ("blur", cfg.blur), ("mean", ",".join(map(str, cfg.mean))),
            ("std", ",".join(map(str, cfg.std))),
            ("flip_pairs", flip_pairs or ",".join(f"{a}:{b}" for a, b in cfg.flip_pairs) or ","),
        ):  # fmt: skip
            bw.param(name, value)
        write_xclbin(bw, "gemm")
        write_xclbin(bw, "mha")
        written: set[str] = set()
        for key, rec in records.items():
            gw = gemms[key]
            bias = gw.bias
            if version == 2 and (key.endswith(".down") or key.startswith("d")):
                host[f"{key}.bias"] = np.zeros(gw.w.shape[1], np.float32) if bias is None else bias
                bias = None
            w, b = _pad_gemm(GemmWeights(gw.w, bias, gw.epilogue))
            kp, np_ = w.shape
            tile_n = 128 if kp == 512 else 64
            packed = pack_gemm_b(w, b, tile_n, 512, CT_MAX_K_FOR_N[tile_n])
            bw.tensor(key, packed, "u8")
            if rec not in written:
                written.add(rec)
                insts = f"kernels/{rec}.bin"
                bw.file(insts, np.arange(16, dtype=np.uint32).tobytes())
                fields: dict[str, Any] = dict(
                    ctx="gemm", insts=insts, M=256, K=kp, N=np_, tile_n=tile_n,
                    tile_k=512, ct_k=CT_MAX_K_FOR_N[tile_n], bias=b is not None,
                    epilogue=gw.epilogue, b_bytes=packed.nbytes,
                )  # fmt: skip
                if key in strides:
                    lda, rows = strides[key]
                    c_stride = None if key.startswith("d") else np_ + GEMM_N_ALIGN
                    fields.update(strided_gemm_fields(kp, np_, 256, lda, c_stride, rows))
                bw.record("gemm", rec, **fields)
        write_mha(bw, "mha", ctx="mha", heads=cfg.heads, d=cfg.hd, seq=cfg.tokens)
        for name, t in host.items():
            bw.tensor(name, np.asarray(t, np.float32).reshape(-1), "f32")
        for name, case in (refs or {}).items():
            h, w = case["rgb"].shape[:2]
            bw.record("ref", name, w=w, h=h)
            for part, dtype in REF_TENSORS.items():
                kind = np.uint8 if dtype == "u8" else np.float32
                bw.tensor(f"ref.{name}.{part}", np.asarray(case[part], kind).reshape(-1), dtype)
    return Path(path)


def _head_strides(cfg: Config) -> dict[str, tuple[int | None, int]]:
    """Head op key -> (lda or None for K, GEMM rows) of the strided record form (docs/pose.md)."""
    out: dict[str, tuple[int | None, int]] = {}
    c, h0, w0 = cfg.D, cfg.gh, cfg.gw
    for j, c_out in enumerate(cfg.up):
        out[f"d{j}"] = (2 * c, (h0 + 1) * (w0 + 2))
        c, h0, w0 = c_out, 2 * h0, 2 * w0
    for j in range(len(cfg.convs)):
        out[f"c{j}"] = (None, h0 * w0)
    out["pred"] = (None, h0 * w0)
    return out
