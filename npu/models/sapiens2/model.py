"""Sapiens2-Pose forward: 3 x H x W crops -> K x Hh x Wh heatmaps, over the steps a backend runs.

Backbone (docs/pose.md): patch GEMM, CLS + registers, pre-norm blocks with q/k RMSNorm, 2-D
RoPE on patch tokens, (GQA) attention, SwiGLU MLP, final RMSNorm. Head (docs/pose.md,
"Forward"): transposed convs as one 4-phase GEMM each, InstanceNorm + SiLU, 1x1 convs,
predictor. The host glue here (norms, the attention staging, residuals, deconv pairs and
scatter, InstanceNorm + SiLU) is shared by every backend; what runs on a device is the
`Sapiens2Ops` steps: `KeyedOps` runs them over npu.ops (cpu: float32 numpy),
npu.models.sapiens2.npu's replay on a bundle's kernels.
Reference: transformers 5.23.0 models/sapiens2/modeling_sapiens2.py (Sapiens2ForPoseEstimation).

Weights as the device takes them: RMSNorm weights (norm1, norm2, final norm) are folded into
the following GEMM's B rows and LayerScale lambda1 into the o GEMM, so the host norms carry no
weight. GEMM keys: "patch", "{i}.qkv", "{i}.o", "{i}.gu", "{i}.down", "d{j}", "c{j}", "pred".
Host tensors: "prefix", "{i}.q_norm", "{i}.k_norm", "rope.cos", "rope.sin", and, when a
bundle leaves biases to the host, "{i}.down.bias" and "d{j}.bias".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from npu.device import run_steps
from npu.models.sapiens2 import kernels
from npu.models.sapiens2.config import Config, ModelError
from npu.ops import LOG2E, GemmWeights, Ops


def rope_tables(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [gh*gw, hd] of the patch tokens, as HF computes them (in float32).

    Patch centres are normalised to [-1, 1] per axis; angles 2π·coord / theta^(4k/hd) for
    k < hd/4, y frequencies then x frequencies, tiled twice.
    """
    f32 = np.float32
    ch = (np.arange(cfg.gh, dtype=f32) + f32(0.5)) / f32(cfg.gh)
    cw = (np.arange(cfg.gw, dtype=f32) + f32(0.5)) / f32(cfg.gw)
    coords = np.stack(np.meshgrid(ch, cw, indexing="ij"), axis=-1).reshape(-1, 2)
    coords = f32(2.0) * coords - f32(1.0)
    exps = (np.arange(cfg.hd // 4, dtype=np.float64) * (4 / cfg.hd)).astype(f32)
    inv_freq = f32(1.0) / np.power(f32(cfg.rope_theta), exps)
    angles = (f32(2 * math.pi) * coords[:, :, None]) * inv_freq[None, None, :]
    angles = np.tile(angles.reshape(len(coords), -1), 2)
    return np.cos(angles).astype(f32), np.sin(angles).astype(f32)


def gemm_shapes(cfg: Config) -> dict[str, tuple[int, int]]:
    """op key -> (K, N') the forward passes and expects (N' after gu's swiglu epilogue)."""
    d, hd = cfg.D, cfg.hd
    shapes = {"patch": (3 * cfg.patch**2, d)}
    for i, kv in enumerate(cfg.kv_heads):
        shapes[f"{i}.qkv"] = (d, (cfg.heads + 2 * kv) * hd)
        shapes[f"{i}.o"] = (d, d)
        shapes[f"{i}.gu"] = (d, cfg.I)
        shapes[f"{i}.down"] = (cfg.I, d)
    c = d
    for j, c_out in enumerate(cfg.up):
        shapes[f"d{j}"] = (4 * c, 4 * c_out)
        c = c_out
    for j, c_out in enumerate(cfg.convs):
        shapes[f"c{j}"] = (c, c_out)
        c = c_out
    shapes["pred"] = (c, cfg.K)
    return shapes


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) over the last axis, float32, without a weight."""
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float32)
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))


IN_BLOCK = 256  # pixels per partial sum of InstanceNorm's mean and variance


def block_sums(x: np.ndarray) -> np.ndarray:
    """InstanceNorm's mean sums: float32 [pixels, C] -> float64 [ceil(pixels / IN_BLOCK), C],
    row b = rows [b·IN_BLOCK, (b+1)·IN_BLOCK) of x summed in float64 in row order: an order
    any number of threads keeps (each block is one thread's), with no float32 copy of the
    rows (npu.models.sapiens2.kernels.block_sums, the replay's, reads them from bf16)."""
    blocks = -(-len(x) // IN_BLOCK)
    sums = np.empty((blocks, x.shape[1]), np.float64)
    for b in range(blocks):
        sums[b] = np.cumsum(x[b * IN_BLOCK : (b + 1) * IN_BLOCK], axis=0, dtype=np.float64)[-1]
    return sums


def block_square_sums(centred: np.ndarray) -> np.ndarray:
    """InstanceNorm's variance sums: block_sums of the squares of float32 centred values,
    each square exact in float64 (kernels.block_square_sums, the replay's)."""
    blocks = -(-len(centred) // IN_BLOCK)
    sums = np.empty((blocks, centred.shape[1]), np.float64)
    for b in range(blocks):
        d = centred[b * IN_BLOCK : (b + 1) * IN_BLOCK].astype(np.float64)
        sums[b] = np.cumsum(d * d, axis=0)[-1]  # cumsum: defined in row order
    return sums


def mean_of_blocks(sums: np.ndarray, pixels: int) -> np.ndarray:
    """The mean float32 [C] over `pixels` from block sums, added in block order, rounded once."""
    return (np.cumsum(sums, axis=0)[-1] / pixels).astype(np.float32)


def instance_norm_silu(x: np.ndarray, eps: float) -> np.ndarray:
    """InstanceNorm (per channel over pixels, biased variance, no affine) then SiLU.

    x: float32 [pixels, C] -> float32 [pixels, C]. The mean and then the biased variance of
    the float32 centred values are float64 sums in blocks (block_sums, block_square_sums),
    each rounded once to float32 (torch's InstanceNorm reduces in float32: this is closer to
    the exact values). SiLU is npu.ops.silu's x·0.5·(1 + tanh(x/2)), evaluated in place in
    the same order.
    """
    centred = x - mean_of_blocks(block_sums(x), len(x))
    var = mean_of_blocks(block_square_sums(centred), len(x))
    centred *= np.float32(1.0) / np.sqrt(var + np.float32(eps))
    out = np.multiply(centred, np.float32(0.5))
    np.tanh(out, out=out)
    out += np.float32(1.0)
    out *= np.float32(0.5)
    out *= centred
    return out


def deconv_pairs(x: np.ndarray) -> np.ndarray:
    """The deconv GEMM's A as taconite-sapiens2's model.rs `head` writes it, for x float32
    [h0, w0, C] (docs/pose.md): row y·(w0+2) + x is X2[y][x] = [xp[y][x] | xp[y+1][x]] of x
    zero-padded by 1, y in [0, h0], x in [0, w0+1]: float32 [(h0+1)(w0+2), 2C]. GEMM row r
    reads 4C values from r·2C (lda = 2C, rows overlap; the last row reads 2C past the end).
    """
    h0, w0, c = x.shape
    pairs = np.zeros(((h0 + 1) * (w0 + 2), 2 * c), np.float32)
    x2 = pairs.reshape(h0 + 1, w0 + 2, 2, c)
    x2[1:, 1:-1, 0] = x  # xp[y]: padded row y holds x row y-1
    x2[:-1, 1:-1, 1] = x  # xp[y+1]
    return pairs


def deconv_gemm_input(x: np.ndarray) -> np.ndarray:
    """The 4-phase transposed-conv GEMM's A for x float32 [h0, w0, C], rows dense.

    Row r = sy·(w0+2) + sx holds [xp[sy, sx], xp[sy+1, sx], xp[sy, sx+1], xp[sy+1, sx+1]]
    of x zero-padded by 1 (K = 4C, (dx, dy, c) order): float32 [(h0+1)(w0+2), 4C], i.e.
    deconv_pairs(x) read at row stride 2C.
    """
    h0, w0, c = x.shape
    rows = (h0 + 1) * (w0 + 2)
    pairs = deconv_pairs(x)
    a = np.zeros((rows, 4 * c), np.float32)
    a[:, : 2 * c] = pairs
    a[:-1, 2 * c :] = pairs[1:]
    return a


def deconv_scatter(c: np.ndarray, h0: int, w0: int, c_out: int) -> np.ndarray:
    """Interleave the 4-phase GEMM output [(h0+1)(w0+2), 4·C_out] into [2h0, 2w0, C_out].

    Output pixel (oy, ox), a = oy % 2, b = ox % 2, reads window (oy//2 + a, ox//2 + b),
    columns (2a + b)·C_out ... +C_out.
    """
    win = c.reshape(h0 + 1, w0 + 2, 2, 2, c_out)
    out = np.empty((h0, 2, w0, 2, c_out), np.float32)
    for a in range(2):
        for b in range(2):
            out[:, a, :, b] = win[a : a + h0, b : b + w0, a, b]
    return out.reshape(2 * h0, 2 * w0, c_out)


def stage_attention(
    qkv: np.ndarray,
    cfg: Config,
    kv: int,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    prefix: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The attention's staged rows from the qkv GEMM's output, as taconite-sapiens2's model.rs
    `backbone` stages them: qkv float32 [T, (heads + 2 kv)·hd] (columns q | k | v), or the
    GEMM's bf16 bits of it (uint16, widened exactly as bf16_to_f32) ->
    float32 [T, 3D], row t = [q_t·log2(e)/sqrt(hd) | k_t repeated to every query head |
    v_t repeated], q and k RMS-normed with their weights (when the config has q/k norm) and
    rotated (the rows after the first `prefix`, default cfg.prefix, with the table rows
    cos, sin [T - prefix, hd]: half-split RoPE, x·cos + rotate_half(x)·sin). Query head h
    reads kv head h // (heads / kv) (HF `repeat_kv`). Written into `out` (float32 [T, 3D])
    when given; rows are independent, so a chunk of rows with its table rows stages as those
    rows of the whole; given uint16 bits, `out` may be uint16 too, for the rows rounded as
    f32_to_bf16. One compiled pass (npu.models.sapiens2.kernels.stage)."""
    prefix = cfg.prefix if prefix is None else prefix
    out = np.empty((len(qkv), 3 * cfg.D), np.float32) if out is None else out
    f32 = np.float32
    qkv = np.asarray(qkv)
    bits = qkv.dtype == np.uint16
    if out.dtype != f32 and not (bits and out.dtype == np.uint16):
        raise ModelError(f"stage_attention: out {out.dtype} for qkv {qkv.dtype}")
    common = (cfg.heads, kv, cfg.hd, prefix, np.asarray(q_norm, f32), np.asarray(k_norm, f32),
              cos, sin, f32(cfg.eps), f32(LOG2E / math.sqrt(cfg.hd)), cfg.qk_norm, out)  # fmt: skip
    if bits:
        (kernels.stage_bits_bf16 if out.dtype == np.uint16 else kernels.stage_bits)(qkv, *common)
    else:
        kernels.stage(np.asarray(qkv, f32), *common)
    return out


def staged_attention(stage: np.ndarray, heads: int, hd: int) -> np.ndarray:
    """What the attention kernel computes from stage_attention's rows, in float32: per head,
    softmax with exp2 of the prescaled scores (= softmax(q·kᵀ/sqrt(hd))) times v.
    stage float32 [T, 3D] -> float32 [T, D] token-major (head h at columns h·hd)."""
    t, d = len(stage), heads * hd
    q, k, v = (stage[:, i * d : (i + 1) * d].reshape(t, heads, hd).transpose(1, 0, 2)
               for i in range(3))  # fmt: skip
    s = np.matmul(q, k.transpose(0, 2, 1))
    p = np.exp2(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v).transpose(1, 0, 2).reshape(t, d).astype(np.float32)


Stager = Callable[[np.ndarray], np.ndarray]


class Sapiens2Ops(Protocol):
    """The steps of the forward a backend runs (all float32 in and out).

    attention(i, a, stage): layer i's attention branch for a = rms_norm(x) [T, D]: the qkv
    GEMM, `stage` (stage_attention bound to layer i) on its output, the attention, the o GEMM
    -> [T, D]. mlp(i, a): down(gu(a)) -> [T, D]. deconv(j, x [h0, w0, C]) -> the 4-phase GEMM's
    C [(h0+1)(w0+2), 4 C_out]. conv(j, y [px, C]) -> [px, C_out]; pred(y) -> [px, K].
    """

    backend: str

    def patch(self, a: np.ndarray) -> np.ndarray: ...

    def attention(self, i: int, a: np.ndarray, stage: Stager) -> np.ndarray: ...

    def mlp(self, i: int, a: np.ndarray) -> np.ndarray: ...

    def deconv(self, j: int, x: np.ndarray) -> np.ndarray: ...

    def conv(self, j: int, y: np.ndarray) -> np.ndarray: ...

    def pred(self, y: np.ndarray) -> np.ndarray: ...


class KeyedOps:
    """The forward's steps over an op interface (npu.ops.Ops: gemm by key), as the cpu backend
    runs them: float32 GEMMs and staged_attention."""

    def __init__(self, ops: Ops, config: Config) -> None:
        self.ops, self.config, self.backend = ops, config, ops.backend

    def patch(self, a: np.ndarray) -> np.ndarray:
        return self.ops.gemm("patch", a)

    def attention(self, i: int, a: np.ndarray, stage: Stager) -> np.ndarray:
        staged = stage(self.ops.gemm(f"{i}.qkv", a))
        return self.ops.gemm(f"{i}.o", staged_attention(staged, self.config.heads, self.config.hd))

    def mlp(self, i: int, a: np.ndarray) -> np.ndarray:
        return self.ops.gemm(f"{i}.down", self.ops.gemm(f"{i}.gu", a))

    def deconv(self, j: int, x: np.ndarray) -> np.ndarray:
        return self.ops.gemm(f"d{j}", deconv_gemm_input(x))

    def conv(self, j: int, y: np.ndarray) -> np.ndarray:
        return self.ops.gemm(f"c{j}", y)[:, : self.config.convs[j]]

    def pred(self, y: np.ndarray) -> np.ndarray:
        return self.ops.gemm("pred", y)[:, : self.config.K]


class Sapiens2Pose:
    """A loaded Sapiens2-Pose: `heatmaps(crops)` on the backend its ops name.

    ops: the Sapiens2Ops steps (KeyedOps on cpu, the bundle replay on sim / npu); host: the
    float32 host tensors named in the module docstring; weights: the float32 GEMM weights by
    key when the model was built from them (from_pretrained), else None.
    """

    def __init__(
        self,
        config: Config,
        ops: Sapiens2Ops,
        host: Mapping[str, np.ndarray],
        weights: Mapping[str, GemmWeights] | None = None,
    ) -> None:
        self.config = config
        self.ops = ops
        self.host = dict(host)
        self.weights = dict(weights) if weights is not None else None
        for name in ["prefix", "rope.cos", "rope.sin"] + [
            f"{i}.{n}" for i in range(config.layers) for n in ("q_norm", "k_norm")
        ]:
            if name not in self.host:
                raise ModelError(f"sapiens2: host tensor {name} is missing")
        self._prefix = self.host["prefix"].reshape(config.prefix, config.D).astype(np.float32)
        patches = config.gh * config.gw
        self._cos = self.host["rope.cos"].reshape(patches, config.hd).astype(np.float32)
        self._sin = self.host["rope.sin"].reshape(patches, config.hd).astype(np.float32)

    @property
    def backend(self) -> str:
        return self.ops.backend

    def close(self) -> None:
        """Free what the backend holds (a bundle replay's kernels and buffers; cpu: nothing)."""
        close = getattr(self.ops, "close", None)
        if callable(close):
            close()

    def heatmaps(self, crops: np.ndarray) -> np.ndarray:
        """crops: float32 [N, 3, H, W] normalised -> heatmaps float32 [N, K, Hh, Wh]
        (Config.heatmap_size: gh·2^len(up) x gw·2^len(up), taconite-sapiens2 lib.rs
        `Config::heatmap`)."""
        cfg = self.config
        crops = np.asarray(crops)
        if crops.ndim != 4 or crops.shape[1:] != (3, cfg.H, cfg.W) or crops.dtype != np.float32:
            raise ModelError(
                f"sapiens2: crops must be float32 [N, 3, {cfg.H}, {cfg.W}], "
                f"got {crops.dtype} {crops.shape}"
            )
        steps = getattr(self.ops, "heatmap_steps", None)
        if steps is not None:
            out = np.empty((len(crops), cfg.K, *cfg.heatmap_size), np.float32)
            for crop, hm in zip(crops, out, strict=True):
                run_steps(steps(crop, out=hm))
            return out
        return np.stack([self._heatmap(c) for c in crops])

    def features(self, crop: np.ndarray) -> np.ndarray:
        """One crop float32 [3, H, W] -> final-normed patch tokens float32 [gh*gw, D].

        The final norm's weight is folded into d0, so these are unweighted.
        """
        cfg = self.config
        steps = getattr(self.ops, "feature_steps", None)
        if steps is not None:
            return run_steps(steps(np.asarray(crop, np.float32)))
        p = cfg.patch
        a = crop.reshape(3, cfg.gh, p, cfg.gw, p).transpose(1, 3, 0, 2, 4).reshape(-1, 3 * p * p)
        x = np.concatenate([self._prefix, self.ops.patch(a)])
        for i in range(cfg.layers):
            x = self._block(i, x)
        return rms_norm(x[cfg.prefix :], cfg.eps)

    def _block(self, i: int, x: np.ndarray) -> np.ndarray:
        cfg, host = self.config, self.host
        q_norm, k_norm, kv = host[f"{i}.q_norm"], host[f"{i}.k_norm"], cfg.kv_heads[i]

        def stage(qkv: np.ndarray) -> np.ndarray:
            return stage_attention(qkv, cfg, kv, q_norm, k_norm, self._cos, self._sin)

        x = x + self.ops.attention(i, rms_norm(x, cfg.eps), stage)
        x = x + self.ops.mlp(i, rms_norm(x, cfg.eps))
        bias = host.get(f"{i}.down.bias")
        return x if bias is None else x + bias

    def _heatmap(self, crop: np.ndarray) -> np.ndarray:
        cfg = self.config
        x = self.features(crop).reshape(cfg.gh, cfg.gw, cfg.D)
        for j, c_out in enumerate(cfg.up):
            h0, w0 = x.shape[:2]
            c = self.ops.deconv(j, x)
            bias = self.host.get(f"d{j}.bias")
            if bias is not None:
                c = c + bias[: 4 * c_out]
            y = deconv_scatter(c[:, : 4 * c_out], h0, w0, c_out).reshape(-1, c_out)
            x = instance_norm_silu(y, cfg.in_eps).reshape(2 * h0, 2 * w0, c_out)
        hh, wh = x.shape[:2]
        y = x.reshape(hh * wh, -1)
        for j in range(len(cfg.convs)):
            y = instance_norm_silu(self.ops.conv(j, y), cfg.in_eps)
        return self.ops.pred(y).T.reshape(cfg.K, hh, wh).copy()
