"""Writes a cpu-backend Sapiens2-Pose as a bundle in taconite-sapiens2's record form that the
simulated NPU runs (docs/bundles.md, docs/pose.md).

Records carry only what taconite reads (`gemm <key> M K N lda c_stride rows a_elems c_elems
ctx insts`, `mha q_elems k_elems v_elems o_elems ctx insts`); what a real kernel has compiled
in (B's tile order, bias, epilogue, the attention's geometry) goes into the sim's own
instruction words (npu.sim_kernels.GemmProgram / MhaProgram), which no runtime reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npu.models.sapiens2.config import Config, ModelError
from npu.models.sapiens2.keypoints import FLIP_PAIRS, NAMES
from npu.models.sapiens2.model import Sapiens2Pose
from npu.models.sapiens2.npu import gemm_keys, host_uses, qkv_width
from npu.ops import GemmWeights

GEMM_K_ALIGN = 512  # flm.GEMM's K % 512 (docs/device.md)
GEMM_M = 256  # the compiled tile height (flm.GEMM's M % 256); one dispatch runs `rows` rows
CROP_PAD = 64  # c<j> / pred: N padded to this, C rows this much wider than N
KEYPOINTS = len(NAMES)  # 308

REF_TENSORS = {
    "rgb": "u8", "box": "f32", "pixels": "f32", "features": "bf16", "heatmaps": "bf16",
    "keypoints": "f32", "scores": "f32",
}  # fmt: skip


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _tile_n(n: int, key: str) -> int:
    """The widest flm.GEMM tile_n (64, 32, 16) dividing n."""
    for t in (64, 32, 16):
        if n % t == 0:
            return t
    raise ModelError(f"gemm {key}: N={n} is not a multiple of 16, which flm.GEMM's tiles need")


def _padded_b(gw: GemmWeights, k: int, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """B [K, N] (swiglu: [K, 2N], each half g | u padded to N) and its bias, zero-padded."""
    halves = 2 if gw.epilogue == "swiglu" else 1
    k0, cols = gw.w.shape
    half = cols // halves
    w = np.zeros((k, n * halves), np.float32)
    b = None if gw.bias is None else np.zeros(n * halves, np.float32)
    for h in range(halves):
        w[:k0, h * n : h * n + half] = gw.w[:, h * half : (h + 1) * half]
        if b is not None:
            b[h * n : h * n + half] = gw.bias[h * half : (h + 1) * half]
    return w, b


def record_layout(cfg: Config) -> dict[str, dict[str, int]]:
    """Each gemm record's fields as the sim writer chooses them: K padded to 512 (B's extra
    rows zero), lda the row stride the host writes A at (so lda < K reads overlapping rows,
    as taconite's dense host A does wherever K is padded), rows the rows taconite's host
    needs in one dispatch, N the host's width (c<j> / pred padded, with C rows CROP_PAD
    wider), and the view sizes a_elems = (rows-1)·lda + K, c_elems = (rows-1)·c_stride + N."""
    out: dict[str, dict[str, int]] = {}
    uses = host_uses(cfg)
    windows, h0, w0 = {}, cfg.gh, cfg.gw
    for j in range(len(cfg.up)):
        windows[f"d{j}"] = (h0 + 1) * (w0 + 2)  # every X2 row the host writes
        h0, w0 = 2 * h0, 2 * w0
    for key in gemm_keys(cfg):
        use = uses[key]
        k = _round_up(use.k, GEMM_K_ALIGN)
        rows = windows.get(key, use.rows)
        if key == "pred" or key[0] == "c":
            n = _round_up(use.n, CROP_PAD)
            c_stride = n + CROP_PAD
        else:
            n = use.n if use.c_stride is not None else _round_up(use.n, 16)
            c_stride = n
        lda = use.lda if use.lda is not None else out["gu"]["c_stride"]
        out[key] = dict(
            M=GEMM_M, K=k, N=n, lda=lda, c_stride=c_stride, rows=rows,
            a_elems=(rows - 1) * lda + k, c_elems=(rows - 1) * c_stride + n,
        )  # fmt: skip
    return out


def _flip_pairs(cfg: Config) -> str:
    """The flip_pairs param as taconite's Config::load parses it (every item a:b): the model's
    pairs, else the 308-keypoint list's, else 0:0 (a pair that swaps nothing)."""
    pairs = cfg.flip_pairs or (FLIP_PAIRS if cfg.K == KEYPOINTS else ((0, 0),))
    return ",".join(f"{a}:{b}" for a, b in pairs)


def write_sim_bundle(
    model: Sapiens2Pose,
    path: str | Path,
    version: int = 1,
    refs: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    host_bias: Sequence[str] | None = None,
) -> Path:
    """Write a cpu-backend model as a bundle the simulated NPU runs; returns its directory.

    version 1 is the 0.4b format (every bias on the device); version 2 the 1b format, which
    leaves `{i}.down.bias` to the host (taconite-sapiens2 README @93506d7). host_bias overrides
    which GEMMs leave their bias to the host: "down" and / or "deconv" (`d{j}.bias`, which
    taconite also reads when present). One xclbin per distinct K (as the 0.4b bundle's
    contexts, one per flm.GEMM K) plus one for the attention. Weights are packed with
    npu.sim_kernels.pack_gemm_b (bfp16ebs8, bias bf16 after it); IRON's real packing is unpublished.
    refs: validation cases {name: {rgb uint8 [h, w, 3], box [4], pixels [3, H, W], features
    [gh*gw, D], heatmaps [K, Hh, Wh], keypoints [K, 2], scores [K]}} as `ref <name> w= h=`
    records and ref.<name>.* tensors.
    """
    from npu.bundle_writer import BundleWriter
    from npu.sim_bundle import write_xclbin
    from npu.sim_kernels import CT_MAX_K_FOR_N, GemmProgram, MhaProgram, pack_gemm_b

    cfg, gemms = model.config, model.weights
    if gemms is None:
        raise ModelError("write_sim_bundle needs a model loaded with its float32 weights")
    if host_bias is None:
        host_bias = ("down",) if version == 2 else ()
    layout = record_layout(cfg)
    host = dict(model.host)
    with BundleWriter(path, version) as bw:
        for name, value in (
            ("D", cfg.D), ("I", cfg.I), ("layers", cfg.layers), ("heads", cfg.heads),
            ("hd", cfg.hd), ("kv_heads", ",".join(map(str, cfg.kv_heads))), ("regs", cfg.regs),
            ("patch", cfg.patch), ("H", cfg.H), ("W", cfg.W), ("eps", cfg.eps),
            ("in_eps", cfg.in_eps), ("up", ",".join(map(str, cfg.up))),
            ("convs", ",".join(map(str, cfg.convs))), ("K", cfg.K), ("box_pad", cfg.box_pad),
            ("blur", cfg.blur), ("mean", ",".join(map(str, cfg.mean))),
            ("std", ",".join(map(str, cfg.std))), ("flip_pairs", _flip_pairs(cfg)),
        ):  # fmt: skip
            bw.param(name, value)
        for k in sorted({f["K"] for f in layout.values()}):
            write_xclbin(bw, f"gemm_k{k}")
        write_xclbin(bw, "mha")
        programs: dict[str, GemmProgram] = {}
        for key, record in _op_records(cfg).items():
            gw = gemms[key]
            f = layout[record]
            bias = gw.bias
            to_host = ("down" in host_bias and key.endswith(".down")) or (
                "deconv" in host_bias and key[0] == "d" and key[1:].isdigit()
            )
            if to_host and bias is not None:
                host[f"{key}.bias"] = bias
                bias = None
            w, b = _padded_b(GemmWeights(gw.w, bias, gw.epilogue), f["K"], f["N"])
            tile_n = _tile_n(f["N"], record)
            prog = GemmProgram(tile_n, GEMM_K_ALIGN, CT_MAX_K_FOR_N[tile_n], b is not None,
                               gw.epilogue, w.shape[1])  # fmt: skip
            if programs.setdefault(record, prog) != prog:
                raise ModelError(f"gemm {record}: {key} differs from the record's other GEMMs")
            bw.tensor(key, pack_gemm_b(w, b, prog.tile_n, prog.tile_k, prog.ct_k), "u8")
        for record, prog in programs.items():
            insts = f"kernels/{record}.bin"
            bw.file(insts, prog.words())
            bw.record("gemm", record, **layout[record], ctx=f"gemm_k{layout[record]['K']}",
                      insts=insts)  # fmt: skip
        t, d = cfg.tokens, cfg.D
        bw.file("kernels/mha.bin", MhaProgram(t, cfg.heads, cfg.hd, 3 * d, 0, d, 2 * d, d).words())
        bw.record("mha", q_elems=t * 3 * d, k_elems=t * 3 * d, v_elems=t * 3 * d,
                  o_elems=t * d, ctx="mha", insts="kernels/mha.bin")  # fmt: skip
        for name, value in host.items():
            bw.tensor(name, np.asarray(value, np.float32).reshape(-1), "f32")
        for name, case in (refs or {}).items():
            h, w = case["rgb"].shape[:2]
            bw.record("ref", name, w=w, h=h)
            for part, dtype in REF_TENSORS.items():
                kind = np.uint8 if dtype == "u8" else np.float32
                bw.tensor(f"ref.{name}.{part}", np.asarray(case[part], kind).reshape(-1), dtype)
    return Path(path)


def _op_records(cfg: Config) -> dict[str, str]:
    """Weight tensor (op key) -> the gemm record it runs on, in record order."""
    out = {"patch": "patch"}
    for i in range(cfg.layers):
        out[f"{i}.qkv"] = f"qkv{qkv_width(cfg, i)}"
        out.update({f"{i}.{n}": n for n in ("o", "gu", "down")})
    out.update({f"d{j}": f"d{j}" for j in range(len(cfg.up))})
    out.update({f"c{j}": f"c{j}" for j in range(len(cfg.convs))})
    out["pred"] = "pred"
    return out
