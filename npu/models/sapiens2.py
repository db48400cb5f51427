"""Sapiens2-Pose forward: 3 x H x W crops -> K x H/4 x W/4 heatmaps, over the op interface.

Backbone (spec sapiens2 §3): patch GEMM, CLS + registers, pre-norm blocks with q/k RMSNorm,
2-D RoPE on patch tokens, (GQA) attention, SwiGLU MLP, final RMSNorm. Head (§4): transposed
convs as one 4-phase GEMM each, InstanceNorm + SiLU, 1x1 convs, predictor. Every projection
is `ops.gemm` by key and attention is `ops.mha`; the host glue here is shared by all backends.
Reference: transformers 5.23.0 models/sapiens2/modeling_sapiens2.py (Sapiens2ForPoseEstimation).

Weights as the device takes them: RMSNorm weights (norm1, norm2, final norm) are folded into
the following GEMM's B rows and LayerScale lambda1 into the o GEMM, so the host norms carry no
weight. GEMM keys: "patch", "{i}.qkv", "{i}.o", "{i}.gu", "{i}.down", "d{j}", "c{j}", "pred";
attention key "mha". Host tensors: "prefix", "{i}.q_norm", "{i}.k_norm", "rope.cos",
"rope.sin", and, when a bundle leaves biases to the host, "{i}.down.bias" and "d{j}.bias".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu.ops import GemmWeights, NumpyOps, Ops
from pipeline.errors import NpucamError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ModelError(NpucamError):
    """A Sapiens2 config, checkpoint or input the forward cannot use."""


@dataclass(frozen=True)
class Config:
    """Sapiens2-Pose sizes, named as the bundle params of spec §1.2."""

    D: int
    I: int  # noqa: E741 (the spec's name for the MLP width)
    layers: int
    heads: int
    hd: int
    kv_heads: tuple[int, ...]
    regs: int
    patch: int
    H: int
    W: int
    eps: float
    in_eps: float
    up: tuple[int, ...]
    convs: tuple[int, ...]
    K: int
    box_pad: float = 1.25
    blur: int = 11
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    flip_pairs: tuple[tuple[int, int], ...] = ()
    rope_theta: float = 100.0
    qk_norm: bool = True

    def __post_init__(self) -> None:
        where = "sapiens2 config"
        if self.heads * self.hd != self.D:
            raise ModelError(f"{where}: D={self.D} != heads {self.heads} x hd {self.hd}")
        if self.hd % 4:
            raise ModelError(f"{where}: hd={self.hd} must be a multiple of 4 for 2-D RoPE")
        if len(self.kv_heads) != self.layers:
            raise ModelError(
                f"{where}: kv_heads has {len(self.kv_heads)} entries, layers={self.layers}"
            )
        for i, kv in enumerate(self.kv_heads):
            if kv <= 0 or self.heads % kv:
                raise ModelError(f"{where}: kv_heads[{i}]={kv} does not divide heads={self.heads}")
        if self.H % self.patch or self.W % self.patch:
            raise ModelError(
                f"{where}: image {self.H}x{self.W} is not a multiple of patch {self.patch}"
            )
        if not self.up:
            raise ModelError(f"{where}: up (the deconv widths) is empty")

    @property
    def gh(self) -> int:
        return self.H // self.patch

    @property
    def gw(self) -> int:
        return self.W // self.patch

    @property
    def prefix(self) -> int:
        """CLS + register tokens before the patches."""
        return 1 + self.regs

    @property
    def tokens(self) -> int:
        return self.prefix + self.gh * self.gw

    @property
    def heatmap_size(self) -> tuple[int, int]:
        f = 2 ** len(self.up)
        return self.gh * f, self.gw * f

    @classmethod
    def from_hf(cls, path: str | Path) -> Config:
        """From a Hugging Face Sapiens2ForPoseEstimation config.json (file or its directory)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"{path}: cannot read the config: {exc}") from None

        def need(key: str, mapping: Mapping[str, Any] = cfg, where: str = "") -> Any:
            if key not in mapping:
                raise ModelError(f"{path}: missing field {where}{key}")
            return mapping[key]

        head = need("head_config") or {}
        for key, want in (("use_gated_mlp", True), ("hidden_act", "silu")):
            if cfg.get(key, want) != want:
                raise ModelError(f"{path}: {key}={cfg[key]!r}; the pose forward needs {want!r}")
        if head.get("use_pixel_shuffle"):
            raise ModelError(f"{path}: head_config.use_pixel_shuffle is set; pose uses deconvs")
        for key, want in (("upsample_kernel_sizes", 4), ("conv_kernel_sizes", 1)):
            sizes = head.get(key) or []
            if any(s != want for s in sizes):
                raise ModelError(f"{path}: head_config.{key}={sizes}; only {want} is supported")
        d, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        layers = int(need("num_hidden_layers"))
        kv = cfg.get("num_key_value_heads_per_layer")
        if kv is None:
            first = cfg.get("num_first_full_attention_layers", 8)
            last = cfg.get("num_last_full_attention_layers", 8)
            gqa = cfg.get("num_key_value_attention_heads", 8)
            kv = [heads if (i < first or i >= layers - last) else gqa for i in range(layers)]
        size = need("image_size")
        h, w = (size, size) if isinstance(size, int) else size
        patch = need("patch_size")
        if not isinstance(patch, int):
            if patch[0] != patch[1]:
                raise ModelError(f"{path}: patch_size={patch}; only square patches are supported")
            patch = patch[0]
        labels = cfg.get("id2label") or {}
        return cls(
            D=d,
            I=int(need("intermediate_size")),
            layers=layers,
            heads=heads,
            hd=d // heads,
            kv_heads=tuple(int(k) for k in kv),
            regs=int(cfg.get("num_register_tokens", 8)),
            patch=int(patch),
            H=int(h),
            W=int(w),
            eps=float(cfg.get("rms_norm_eps", 1e-6)),
            in_eps=1e-5,
            up=tuple(int(c) for c in need("upsample_out_channels", head, "head_config.")),
            convs=tuple(int(c) for c in head.get("conv_out_channels") or ()),
            K=len(labels) if labels else int(cfg.get("num_labels", 308)),
            flip_pairs=tuple((int(a), int(b)) for a, b in cfg.get("flip_pairs") or ()),
            rope_theta=float(cfg.get("rope_theta", 100.0)),
            qk_norm=bool(cfg.get("use_qk_norm", True)),
        )

    @classmethod
    def from_params(
        cls, params: Mapping[str, str | Sequence[str]], where: str = "params"
    ) -> Config:
        """From bundle params (spec §1.2): name -> value text (or its whitespace-split fields).

        Lists are comma-separated; flip_pairs is "a:b,c:d,...".
        """

        def text(name: str) -> str:
            if name not in params:
                raise ModelError(f"{where}: missing param {name}")
            v = params[name]
            return v if isinstance(v, str) else " ".join(v)

        def num(name: str, kind: type = int) -> Any:
            try:
                return kind(text(name))
            except ValueError:
                raise ModelError(
                    f"{where}: param {name}={text(name)!r} is not {kind.__name__}"
                ) from None

        def nums(name: str, kind: type = int, count: int | None = None) -> tuple:
            raw = text(name).replace(" ", ",")
            try:
                vals = tuple(kind(v) for v in raw.split(",") if v)
            except ValueError:
                raise ModelError(
                    f"{where}: param {name}={raw!r} is not a {kind.__name__} list"
                ) from None
            if count is not None and len(vals) != count:
                raise ModelError(f"{where}: param {name} has {len(vals)} values, wanted {count}")
            return vals

        pairs = []
        for item in text("flip_pairs").replace(" ", ",").split(","):
            if not item:
                continue
            a, sep, b = item.partition(":")
            if not sep or not a.isdigit() or not b.isdigit():
                raise ModelError(f"{where}: param flip_pairs has a bad pair {item!r} (want a:b)")
            pairs.append((int(a), int(b)))
        return cls(
            D=num("D"),
            I=num("I"),
            layers=num("layers"),
            heads=num("heads"),
            hd=num("hd"),
            kv_heads=nums("kv_heads"),
            regs=num("regs"),
            patch=num("patch"),
            H=num("H"),
            W=num("W"),
            eps=num("eps", float),
            in_eps=num("in_eps", float),
            up=nums("up"),
            convs=nums("convs"),
            K=num("K"),
            box_pad=num("box_pad", float),
            blur=num("blur"),
            mean=nums("mean", float, 3),
            std=nums("std", float, 3),
            flip_pairs=tuple(pairs),
        )


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


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) over the last axis, float32, without a weight."""
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float32)
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))


def instance_norm_silu(x: np.ndarray, eps: float) -> np.ndarray:
    """InstanceNorm (per channel over pixels, biased variance, no affine) then SiLU.

    x: float32 [pixels, C] -> float32 [pixels, C]. The per-channel sums are float32 BLAS
    reductions (ones · x), as torch's InstanceNorm reduces in float32 too. SiLU is
    npu.ops.silu's x·0.5·(1 + tanh(x/2)), evaluated in place in the same order.
    """
    n = np.float32(len(x))
    ones = np.ones(len(x), np.float32)
    centred = x - (ones @ x) / n
    out = np.multiply(centred, centred)
    centred *= np.float32(1.0) / np.sqrt((ones @ out) / n + np.float32(eps))
    np.multiply(centred, np.float32(0.5), out=out)
    np.tanh(out, out=out)
    out += np.float32(1.0)
    out *= np.float32(0.5)
    out *= centred
    return out


def deconv_pairs(x: np.ndarray) -> np.ndarray:
    """The strided deconv GEMM's A buffer for x float32 [h0, w0, C] (spec §4).

    Row y·(w0+2) + x is X2[y][x] = [xp[y][x] | xp[y+1][x]] of x zero-padded by 1, for
    y in [0, h0], x in [0, w0+1], plus one zero row past the end: float32
    [(h0+1)(w0+2) + 1, 2C]. GEMM row r reads 4C values from r·2C (lda = 2C, rows overlap).
    """
    h0, w0, c = x.shape
    rows = (h0 + 1) * (w0 + 2)
    pairs = np.zeros((rows + 1, 2 * c), np.float32)
    x2 = pairs[:rows].reshape(h0 + 1, w0 + 2, 2, c)
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
    a = np.empty((rows, 4 * c), np.float32)
    a[:, : 2 * c] = pairs[:-1]
    a[:, 2 * c :] = pairs[1:]
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


def deconv_weights(wt: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """ConvTranspose2d(k4 s2 p1) weight [C, C_out, 4, 4] -> the 4-phase GEMM B [4C, 4·C_out].

    B[(2dx+dy)·C + ci, (2a+b)·C_out + co] = Wt[ci, co, 3-2dy-a, 3-2dx-b] (spec §4), rows
    multiplied by scale[ci] when a preceding norm weight is folded in.
    """
    c, c_out = wt.shape[:2]
    b = np.empty((2, 2, c, 2, 2, c_out), np.float32)  # [dx, dy, ci, a, b, co]
    for dx in range(2):
        for dy in range(2):
            for a in range(2):
                for bb in range(2):
                    b[dx, dy, :, a, bb, :] = wt[:, :, 3 - 2 * dy - a, 3 - 2 * dx - bb]
    if scale is not None:
        b *= scale[None, None, :, None, None, None]
    return b.reshape(4 * c, 4 * c_out)


class Sapiens2Pose:
    """A loaded Sapiens2-Pose: `heatmaps(crops)` on the backend its ops name.

    host: the float32 host tensors named in the module docstring; weights: the float32 GEMM
    weights by key when the model was built from them (from_pretrained), else None.
    """

    def __init__(
        self,
        config: Config,
        ops: Ops,
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

    def heatmaps(self, crops: np.ndarray) -> np.ndarray:
        """crops: float32 [N, 3, H, W] normalised -> heatmaps float32 [N, K, Hh, Wh]."""
        cfg = self.config
        crops = np.asarray(crops)
        if crops.ndim != 4 or crops.shape[1:] != (3, cfg.H, cfg.W) or crops.dtype != np.float32:
            raise ModelError(
                f"sapiens2: crops must be float32 [N, 3, {cfg.H}, {cfg.W}], "
                f"got {crops.dtype} {crops.shape}"
            )
        return np.stack([self._heatmap(c) for c in crops])

    def features(self, crop: np.ndarray) -> np.ndarray:
        """One crop float32 [3, H, W] -> final-normed patch tokens float32 [gh*gw, D].

        The final norm's weight is folded into d0, so these are unweighted.
        """
        cfg = self.config
        p = cfg.patch
        a = crop.reshape(3, cfg.gh, p, cfg.gw, p).transpose(1, 3, 0, 2, 4).reshape(-1, 3 * p * p)
        x = np.concatenate([self._prefix, self.ops.gemm("patch", a)])
        for i in range(cfg.layers):
            x = self._block(i, x)
        return rms_norm(x[cfg.prefix :], cfg.eps)

    def _block(self, i: int, x: np.ndarray) -> np.ndarray:
        cfg = self.config
        heads, hd, kv = cfg.heads, cfg.hd, cfg.kv_heads[i]
        t = len(x)
        qkv = self.ops.gemm(f"{i}.qkv", rms_norm(x, cfg.eps))
        q = qkv[:, : heads * hd].reshape(t, heads, hd)
        k = qkv[:, heads * hd : (heads + kv) * hd].reshape(t, kv, hd)
        v = qkv[:, (heads + kv) * hd :].reshape(t, kv, hd)
        if cfg.qk_norm:
            q = rms_norm(q, cfg.eps) * self.host[f"{i}.q_norm"]
            k = rms_norm(k, cfg.eps) * self.host[f"{i}.k_norm"]
        q, k = self._rope(q), self._rope(k)
        rep = heads // kv
        if rep > 1:
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        o = self.ops.mha(
            "mha",
            np.ascontiguousarray(q.transpose(1, 0, 2)),
            np.ascontiguousarray(k.transpose(1, 0, 2)),
            np.ascontiguousarray(v.transpose(1, 0, 2)),
            scale=hd**-0.5,
        )
        x = x + self.ops.gemm(f"{i}.o", o.transpose(1, 0, 2).reshape(t, heads * hd))
        down = self.ops.gemm(f"{i}.down", self.ops.gemm(f"{i}.gu", rms_norm(x, cfg.eps)))
        x = x + down
        bias = self.host.get(f"{i}.down.bias")
        return x if bias is None else x + bias

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """Rotate the patch tokens of x float32 [T, heads, hd]; prefix tokens pass unchanged."""
        pre = self.config.prefix
        patches = x[pre:]
        half = patches.shape[-1] // 2
        rotated = np.concatenate([-patches[..., half:], patches[..., :half]], axis=-1)
        out = x.copy()
        out[pre:] = patches * self._cos[:, None, :] + rotated * self._sin[:, None, :]
        return out

    def _heatmap(self, crop: np.ndarray) -> np.ndarray:
        cfg = self.config
        x = self.features(crop).reshape(cfg.gh, cfg.gw, cfg.D)
        for j, c_out in enumerate(cfg.up):
            h0, w0 = x.shape[:2]
            key = f"d{j}"
            if key in getattr(self.ops, "strided", ()):
                c = self.ops.gemm_strided(key, deconv_pairs(x), (h0 + 1) * (w0 + 2))
            else:
                c = self.ops.gemm(key, deconv_gemm_input(x))
            bias = self.host.get(f"d{j}.bias")
            if bias is not None:
                c = c + bias
            y = deconv_scatter(c, h0, w0, c_out).reshape(-1, c_out)
            x = instance_norm_silu(y, cfg.in_eps).reshape(2 * h0, 2 * w0, c_out)
        hh, wh = x.shape[:2]
        y = x.reshape(hh * wh, -1)
        for j, c_out in enumerate(cfg.convs):
            y = instance_norm_silu(self.ops.gemm(f"c{j}", y)[:, :c_out], cfg.in_eps)
        return self.ops.gemm("pred", y)[:, : cfg.K].T.reshape(cfg.K, hh, wh).copy()


# The released checkpoints keep the original sapiens2 names; HF renames them on load
# (transformers' conversion_mapping "sapiens2" + "Sapiens2ForPoseEstimation"). Applied in order.
_ORIGINAL_NAMES: tuple[tuple[str, str], ...] = (
    (r"^backbone\.ln1\.", "model.norm."),
    (r"^backbone\.cls_token$", "model.embeddings.cls_token"),
    (r"^backbone\.storage_tokens$", "model.embeddings.register_tokens"),
    (r"^backbone\.patch_embed\.projection\.", "model.embeddings.patch_embeddings."),
    (r"^backbone\.blocks\.(\d+)\.", r"model.model.layer.\1."),
    (r"\.attn\.proj\.", ".attention.o_proj."),
    (r"\.attn\.w([qkv])\.", r".attention.\1_proj."),
    (r"\.attn\.([qk])_norm\.", r".attention.\1_norm."),
    (r"\.attn\.gamma\.weight$", ".layer_scale1.lambda1"),
    (r"\.ffn\.w3\.", ".mlp.down_proj."),
    (r"\.ln1\.", ".norm1."),
    (r"\.ln2\.", ".norm2."),
    (r"^decode_head\.conv_pose\.", "decode_head.predictor."),
)


def hf_state_dict(sd: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Tensor names as HF's Sapiens2ForPoseEstimation modules use them.

    Original-layout names (backbone.blocks.i.attn.wq, ffn.w12, decode_head.deconv_layers.3,
    ...) are renamed; ffn.w12 is split into gate (first half) and up; deconv_layers.3j and
    conv_layers.3j become upsample_layers.j / conv_layers.j (.convolution).
    """
    out: dict[str, np.ndarray] = {}
    for name, t in sd.items():
        for pattern, repl in _ORIGINAL_NAMES:
            name = re.sub(pattern, repl, name)
        m = re.match(r"^decode_head\.(deconv|conv)_layers\.(\d+)\.(weight|bias)$", name)
        if m:
            kind, idx, what = m.groups()
            group = "upsample_layers" if kind == "deconv" else "conv_layers"
            name = f"decode_head.{group}.{int(idx) // 3}.convolution.{what}"
        m = re.match(r"^(.*)\.ffn\.w12\.(weight|bias)$", name)
        if m:
            gate, up = np.split(np.asarray(t), 2, axis=0)
            out[f"{m[1]}.mlp.gate_proj.{m[2]}"] = gate
            out[f"{m[1]}.mlp.up_proj.{m[2]}"] = up
            continue
        out[name] = t
    return out


def _load_safetensors(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{model_dir}: no *.safetensors checkpoint")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types
            raise ModelError(f"{f}: cannot read the checkpoint: {exc}") from None
    return hf_state_dict(tensors)


def hf_weights(
    cfg: Config, sd: Mapping[str, np.ndarray], where: str = "checkpoint"
) -> tuple[dict[str, GemmWeights], dict[str, np.ndarray]]:
    """Fold an HF Sapiens2ForPoseEstimation state dict into GEMM weights and host tensors.

    norm1 / norm2 / final-norm weights scale the rows of the qkv / gu / d0 B; lambda1 scales
    the o GEMM's columns and bias. Missing q/k/v/o/MLP biases (config flags off) are zeros.
    """

    def get(name: str) -> np.ndarray:
        if name not in sd:
            raise ModelError(f"{where}: tensor {name} is missing")
        return np.asarray(sd[name], dtype=np.float32)

    def opt_bias(name: str, n: int) -> np.ndarray:
        return get(name) if name in sd else np.zeros(n, np.float32)

    D, hd = cfg.D, cfg.hd
    emb = "model.embeddings."
    conv = get(emb + "patch_embeddings.weight")
    gemms = {"patch": GemmWeights(conv.reshape(D, -1).T.copy(), get(emb + "patch_embeddings.bias"))}
    prefix = np.concatenate(
        [get(emb + "cls_token").reshape(1, D), get(emb + "register_tokens").reshape(-1, D)]
    )
    host: dict[str, np.ndarray] = {"prefix": prefix.reshape(-1)}
    for i in range(cfg.layers):
        p = f"model.model.layer.{i}."
        att = p + "attention."
        kvw = cfg.kv_heads[i] * hd
        w = np.concatenate([get(att + f"{n}_proj.weight") for n in "qkv"])  # [N, D]
        b = np.concatenate(
            [
                opt_bias(att + "q_proj.bias", D),
                opt_bias(att + "k_proj.bias", kvw),
                opt_bias(att + "v_proj.bias", kvw),
            ]
        )
        gemms[f"{i}.qkv"] = GemmWeights((w * get(p + "norm1.weight")[None, :]).T.copy(), b)
        lam = get(p + "layer_scale1.lambda1")
        gemms[f"{i}.o"] = GemmWeights(
            (get(att + "o_proj.weight").T * lam[None, :]).copy(),
            opt_bias(att + "o_proj.bias", D) * lam,
        )
        mlp = p + "mlp."
        g2 = get(p + "norm2.weight")[:, None]
        gu = np.concatenate(
            [get(mlp + "gate_proj.weight").T, get(mlp + "up_proj.weight").T], axis=1
        )
        gemms[f"{i}.gu"] = GemmWeights(
            (gu * g2).copy(),
            np.concatenate(
                [opt_bias(mlp + "gate_proj.bias", cfg.I), opt_bias(mlp + "up_proj.bias", cfg.I)]
            ),
            "swiglu",
        )
        gemms[f"{i}.down"] = GemmWeights(
            get(mlp + "down_proj.weight").T.copy(), opt_bias(mlp + "down_proj.bias", D)
        )
        if f"{att}q_norm.weight" in sd:
            host[f"{i}.q_norm"] = get(att + "q_norm.weight")
            host[f"{i}.k_norm"] = get(att + "k_norm.weight")
        else:
            host[f"{i}.q_norm"] = host[f"{i}.k_norm"] = np.ones(hd, np.float32)
    final = get("model.norm.weight")
    for j in range(len(cfg.up)):
        wt = get(f"decode_head.upsample_layers.{j}.convolution.weight")
        gemms[f"d{j}"] = GemmWeights(deconv_weights(wt, final if j == 0 else None))
    for j in range(len(cfg.convs)):
        c = f"decode_head.conv_layers.{j}.convolution."
        w = get(c + "weight")
        gemms[f"c{j}"] = GemmWeights(w.reshape(w.shape[0], -1).T.copy(), get(c + "bias"))
    w = get("decode_head.predictor.weight")
    gemms["pred"] = GemmWeights(
        w.reshape(w.shape[0], -1).T.copy(), get("decode_head.predictor.bias")
    )
    cos, sin = rope_tables(cfg)
    host["rope.cos"], host["rope.sin"] = cos.reshape(-1), sin.reshape(-1)
    return gemms, host


def from_pretrained(model_dir: str | Path) -> Sapiens2Pose:
    """An HF Sapiens2ForPoseEstimation directory (config.json + safetensors) on the cpu backend."""
    model_dir = Path(model_dir)
    cfg = Config.from_hf(model_dir)
    gemms, host = hf_weights(cfg, _load_safetensors(model_dir), where=str(model_dir))
    return Sapiens2Pose(cfg, NumpyOps(gemms), host, weights=gemms)


# -- bundles: the simulator's layout of the spec §1.2 records ----------------------------------

GEMM_K_ALIGN = 512  # flm.GEMM's K % 512 (docs/device.md)
GEMM_N_ALIGN = 128  # a multiple of every tile_n


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _gemm_record_keys(cfg: Config) -> dict[str, str]:
    """op key -> the gemm record (kernel) it runs on; one record per distinct shape."""
    keys = {"patch": "patch", "pred": "pred"}
    for i, kv in enumerate(cfg.kv_heads):
        keys[f"{i}.qkv"] = f"qkv{(cfg.heads + 2 * kv) * cfg.hd}"
        keys.update({f"{i}.{n}": n for n in ("o", "gu", "down")})
    keys.update({f"d{j}": f"d{j}" for j in range(len(cfg.up))})
    keys.update({f"c{j}": f"c{j}" for j in range(len(cfg.convs))})
    return keys


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

    Records follow spec §1.2 (gemm keys patch, qkv<width>, o, gu, down, d<j>, c<j>, pred; one
    mha), weights are packed with npu.sim.pack_gemm_b (bfp16ebs8, bias as bf16 after it), and
    host tensors are f32. IRON's real packing is unpublished (spec open question 1), so B and
    A are zero-padded here to flm.GEMM's K % 512 and N % 128; the host pads A and drops the
    extra C columns. version 2 leaves the down and deconv biases to the host.
    refs: validation cases {name: {rgb uint8 [h, w, 3], box [4], pixels [3, H, W], features
    [gh*gw, D], heatmaps [K, Hh, Wh], keypoints [K, 2], scores [K]}} written as spec §6's
    `ref <name> w= h=` records and ref.<name>.* tensors.
    strided: write the head's records in taconite-sapiens2's strided form (spec §1.2, §4):
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
    records = _gemm_record_keys(cfg)
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
    """Head op key -> (lda or None for K, GEMM rows) of the strided record form (spec §4)."""
    out: dict[str, tuple[int | None, int]] = {}
    c, h0, w0 = cfg.D, cfg.gh, cfg.gw
    for j, c_out in enumerate(cfg.up):
        out[f"d{j}"] = (2 * c, (h0 + 1) * (w0 + 2))
        c, h0, w0 = c_out, 2 * h0, 2 * w0
    for j in range(len(cfg.convs)):
        out[f"c{j}"] = (None, h0 * w0)
    out["pred"] = (None, h0 * w0)
    return out


class _PaddedGemms:
    """The op interface over a bundle's padded GEMMs: A is zero-padded to the record's K and
    C cut to the model's N (the host side of the padding write_sim_bundle applies).

    strided: the deconv keys whose records read A at lda = 2C (spec §4); the forward calls
    gemm_strided(key, deconv_pairs(x), rows) for them.
    """

    def __init__(
        self,
        ops: Any,
        valid_n: Mapping[str, int],
        k_pad: Mapping[str, int],
        strided: frozenset[str] = frozenset(),
    ) -> None:
        self.ops = ops
        self.backend = ops.backend
        self._n = dict(valid_n)
        self._k = dict(k_pad)
        self.strided = strided

    def gemm_strided(self, key: str, a: np.ndarray, rows: int) -> np.ndarray:
        c = self.ops.gemm_strided(key, a, rows)
        return c[:, : self._n[key]] if key in self._n else c

    def gemm(self, key: str, a: np.ndarray) -> np.ndarray:
        k = self._k.get(key, a.shape[1])
        if k > a.shape[1]:
            a = np.concatenate([a, np.zeros((len(a), k - a.shape[1]), np.float32)], axis=1)
        c = self.ops.gemm(key, a)
        return c[:, : self._n[key]] if key in self._n else c

    def mha(self, key: str, q, k, v, *, scale: float, causal: bool = False) -> np.ndarray:
        return self.ops.mha(key, q, k, v, scale=scale, causal=causal)


def _valid_shapes(cfg: Config) -> dict[str, tuple[int, int]]:
    """op key -> (K, N') the forward passes and expects (N' after a swiglu epilogue)."""
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


def from_bundle(path: str | Path, device: Any) -> Sapiens2Pose:
    """A bundle (format 1, or 2 with host biases) on a device: an npu.sim.SimDevice or
    npu.xrt.XrtDevice, or the backend name "sim" / "npu" to open one."""
    from npu.bundle import Bundle, BundleError
    from npu.device import kernel_spec
    from npu.ops import DeviceOps

    path = Path(path)
    bundle = Bundle.open(path)
    where = f"{path}/manifest.txt"
    if bundle.version not in (1, 2):
        raise BundleError(f"{where}: version {bundle.version}; Sapiens2 reads versions 1 and 2")
    cfg = Config.from_params(bundle.manifest.params, where=where)
    if device == "sim":
        from npu.sim import SimDevice

        device = SimDevice()
    elif device == "npu":
        from npu.xrt import open_device

        device = open_device()
    elif isinstance(device, str):
        raise ModelError(f"device {device!r}: expected 'sim', 'npu' or a device object")
    records = {r.fields[0]: r for r in bundle.tagged("gemm") if r.fields}
    shapes = _valid_shapes(cfg)
    k_pad: dict[str, int] = {}
    strided: set[str] = set()
    for key, rec in _gemm_record_keys(cfg).items():
        if rec not in records:
            raise BundleError(f"{where}: no gemm record {rec} (for {key})")
        spec = kernel_spec(bundle, records[rec])
        k, n = shapes[key]
        swiglu = spec.get_str("epilogue", "none") == "swiglu"
        kr, nr = spec.get_int("K"), spec.get_int("N") // (2 if swiglu else 1)
        if kr < k or nr < n:
            raise BundleError(f"{spec.where()}: gemm {rec} is K={kr} N'={nr}, {key} needs {k}x{n}")
        lda = spec.get_int("lda", kr)
        if lda != kr:
            if not key.startswith("d") or lda != k // 2:
                raise BundleError(
                    f"{spec.where()}: gemm {rec} has lda={lda}; only the deconvs read A "
                    f"strided, at lda = 2C = {k // 2}"
                )
            strided.add(key)
        k_pad[key] = kr
    host: dict[str, np.ndarray] = {}
    patches = cfg.gh * cfg.gw
    sizes = {
        "prefix": cfg.prefix * cfg.D,
        "rope.cos": patches * cfg.hd,
        "rope.sin": patches * cfg.hd,
    }
    for i in range(cfg.layers):
        sizes[f"{i}.q_norm"] = sizes[f"{i}.k_norm"] = cfg.hd
        if bundle.version == 2:
            sizes[f"{i}.down.bias"] = cfg.D
    if bundle.version == 2:
        sizes.update({f"d{j}.bias": 4 * c for j, c in enumerate(cfg.up)})
    for name, elems in sizes.items():
        bundle.expect(name, "f32", elems)
        host[name] = bundle.f32(name).reshape(-1)
    for key in shapes:
        bundle.entry(key)
    ops = DeviceOps.from_bundle(
        device,
        bundle,
        gemms={key: (rec, key) for key, rec in _gemm_record_keys(cfg).items()},
        mhas={"mha": "mha"},
    )
    padded = _PaddedGemms(ops, {k: n for k, (_, n) in shapes.items()}, k_pad, frozenset(strided))
    return Sapiens2Pose(cfg, padded, host)
