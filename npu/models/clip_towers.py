"""CLIP's two towers as HF CLIPModel's get_image_features / get_text_features.

The forwards follow taconite-clip's layout (spec b.5-b.7): host glue in float32 numpy (patch
embedding, ln_pre, token + position embeddings, pooling, ln_post / ln_final, projections)
around a `TowerLayers` backend that runs one tower's transformer layers over a pass's rows.
`OpsLayers` is that backend over npu.ops (the cpu backend: every projection a `gemm` by key
with LN1 / LN2 affines folded into the qkv / fc1 weights, attention an `mha` per image or per
prompt); npu.models.clip_bundle replays a bundle's kernels on a device. Images run in groups
of 4 and prompts in groups of 8 (the bundle's pass sizes); a partial group is padded and its
padded slots are dropped. Weights load from an HF checkpoint (config.json + *.safetensors,
read with safetensors' numpy API).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from safetensors import safe_open

from npu.ops import GemmWeights, Ops
from pipeline.errors import NpucamError

V_BATCH = 4
T_BATCH = 8
ACTIVATIONS = ("gelu", "quick_gelu")


class CheckpointError(NpucamError):
    """A CLIP checkpoint directory is missing a file, a tensor or a supported setting."""


class EncodeInputError(NpucamError):
    """Pixels or token ids the towers cannot take."""


@dataclass(frozen=True)
class TowerConfig:
    """One transformer tower: layers of width `dim`, `heads` heads, MLP width `mlp`.

    heads is 0 for a bundle's towers: the MHA kernel holds it and the host never needs it."""

    layers: int
    dim: int
    heads: int
    mlp: int
    eps: float
    act: str

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


@dataclass(frozen=True)
class ClipConfig:
    """What the forwards need from an HF CLIPConfig (config.json)."""

    vision: TowerConfig
    text: TowerConfig
    image_size: int
    patch: int
    context: int
    vocab_size: int
    embed_dim: int
    eos_token_id: int

    @property
    def grid(self) -> int:
        return self.image_size // self.patch

    @property
    def v_tokens(self) -> int:
        return self.grid * self.grid + 1

    @classmethod
    def from_json(cls, path: Path) -> ClipConfig:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: cannot read config: {exc}") from None

        def field(section: dict, key: str, where: str):
            if key not in section:
                raise CheckpointError(f"{path}: missing {where}{key}")
            return section[key]

        def tower(section: dict, where: str) -> TowerConfig:
            act = field(section, "hidden_act", where)
            if act not in ACTIVATIONS:
                raise CheckpointError(f"{path}: {where}hidden_act {act!r} not in {ACTIVATIONS}")
            dim, heads = (
                int(field(section, "hidden_size", where)),
                int(field(section, "num_attention_heads", where)),
            )
            if dim % heads:
                raise CheckpointError(f"{path}: {where}hidden_size {dim} % heads {heads} != 0")
            return TowerConfig(
                layers=int(field(section, "num_hidden_layers", where)),
                dim=dim,
                heads=heads,
                mlp=int(field(section, "intermediate_size", where)),
                eps=float(section.get("layer_norm_eps", 1e-5)),
                act=act,
            )

        v = field(raw, "vision_config", "")
        t = field(raw, "text_config", "")
        return cls(
            vision=tower(v, "vision_config."),
            text=tower(t, "text_config."),
            image_size=int(field(v, "image_size", "vision_config.")),
            patch=int(field(v, "patch_size", "vision_config.")),
            context=int(field(t, "max_position_embeddings", "text_config.")),
            vocab_size=int(field(t, "vocab_size", "text_config.")),
            embed_dim=int(raw.get("projection_dim", 512)),
            eos_token_id=int(t.get("eos_token_id", 49407)),
        )


@dataclass(frozen=True)
class HostWeights:
    """Host-side float32 tensors (spec b.2 names): the non-GEMM parts of both towers."""

    v_patch_w: np.ndarray  # [dim, 3·p·p], columns in (channel, ky, kx) order
    v_cls: np.ndarray  # [dim]
    v_pos: np.ndarray  # [v_tokens, dim]
    v_ln_pre: tuple[np.ndarray, np.ndarray]
    v_ln_post: tuple[np.ndarray, np.ndarray]
    v_proj: np.ndarray  # [embed, dim]
    t_tok_emb: np.ndarray  # [vocab, dim]
    t_pos: np.ndarray  # [context, dim]
    t_ln_final: tuple[np.ndarray, np.ndarray]
    t_proj: np.ndarray  # [embed, dim]
    logit_scale: float  # exp of the checkpoint's logit_scale


class _Tensors:
    """Lazy name -> float32 array access over one or more .safetensors files."""

    def __init__(self, model_dir: Path) -> None:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{model_dir}: no *.safetensors file")
        self._where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="np") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    self._where[name] = f
        self.model_dir = model_dir

    def get(self, name: str) -> np.ndarray:
        path = self._where.get(name)
        if path is None:
            raise CheckpointError(f"{self.model_dir}: tensor {name!r} not in the checkpoint")
        try:
            with safe_open(str(path), framework="np") as handle:
                value = handle.get_tensor(name)
        except Exception as exc:  # safetensors raises its own types for dtypes numpy lacks
            raise CheckpointError(f"{path}: cannot read {name!r}: {exc}") from None
        return np.ascontiguousarray(value, dtype=np.float32)


def _folded(ln_w: np.ndarray, ln_b: np.ndarray, w_kn: np.ndarray, bias: np.ndarray):
    """LN affine folded into the following GEMM: (n·g + b)·W + c = n·(g∘W) + (b·W + c)."""
    w64 = w_kn.astype(np.float64)
    w = (ln_w.astype(np.float64)[:, None] * w64).astype(np.float32)
    c = (ln_b.astype(np.float64) @ w64 + bias.astype(np.float64)).astype(np.float32)
    return w, c


def tower_gemms(tensors: _Tensors, prefix: str, key: str, cfg: TowerConfig) -> dict:
    """GemmWeights of every layer of one HF tower, by key `{key}.{i}.{qkv,o,fc1,fc2}`."""
    gemms: dict[str, GemmWeights] = {}
    for i in range(cfg.layers):
        p = f"{prefix}.encoder.layers.{i}"
        w_qkv = np.concatenate(
            [tensors.get(f"{p}.self_attn.{n}_proj.weight").T for n in "qkv"], axis=1
        )
        b_qkv = np.concatenate([tensors.get(f"{p}.self_attn.{n}_proj.bias") for n in "qkv"])
        w, b = _folded(
            tensors.get(f"{p}.layer_norm1.weight"),
            tensors.get(f"{p}.layer_norm1.bias"),
            w_qkv,
            b_qkv,
        )
        gemms[f"{key}.{i}.qkv"] = GemmWeights(w, b)
        gemms[f"{key}.{i}.o"] = GemmWeights(
            np.ascontiguousarray(tensors.get(f"{p}.self_attn.out_proj.weight").T),
            tensors.get(f"{p}.self_attn.out_proj.bias"),
        )
        w, b = _folded(
            tensors.get(f"{p}.layer_norm2.weight"),
            tensors.get(f"{p}.layer_norm2.bias"),
            tensors.get(f"{p}.mlp.fc1.weight").T,
            tensors.get(f"{p}.mlp.fc1.bias"),
        )
        # ops has no quick_gelu epilogue: that activation runs on the host after fc1.
        gemms[f"{key}.{i}.fc1"] = GemmWeights(w, b, "gelu" if cfg.act == "gelu" else "none")
        gemms[f"{key}.{i}.fc2"] = GemmWeights(
            np.ascontiguousarray(tensors.get(f"{p}.mlp.fc2.weight").T),
            tensors.get(f"{p}.mlp.fc2.bias"),
        )
    return gemms


def load_checkpoint(model_dir: str | Path) -> tuple[ClipConfig, HostWeights, dict]:
    """HF CLIPModel directory -> (config, host tensors, GemmWeights by key) for NumpyOps."""
    model_dir = Path(model_dir)
    cfg = ClipConfig.from_json(model_dir / "config.json")
    t = _Tensors(model_dir)

    def ln(name: str) -> tuple[np.ndarray, np.ndarray]:
        return t.get(f"{name}.weight"), t.get(f"{name}.bias")

    patch_w = t.get("vision_model.embeddings.patch_embedding.weight")
    host = HostWeights(
        v_patch_w=patch_w.reshape(patch_w.shape[0], -1),
        v_cls=t.get("vision_model.embeddings.class_embedding"),
        v_pos=t.get("vision_model.embeddings.position_embedding.weight"),
        v_ln_pre=ln("vision_model.pre_layrnorm"),
        v_ln_post=ln("vision_model.post_layernorm"),
        v_proj=t.get("visual_projection.weight"),
        t_tok_emb=t.get("text_model.embeddings.token_embedding.weight"),
        t_pos=t.get("text_model.embeddings.position_embedding.weight"),
        t_ln_final=ln("text_model.final_layer_norm"),
        t_proj=t.get("text_projection.weight"),
        logit_scale=float(np.exp(np.float64(t.get("logit_scale").reshape(())))),
    )
    expected = {
        "v_patch_w": (cfg.vision.dim, 3 * cfg.patch * cfg.patch),
        "v_pos": (cfg.v_tokens, cfg.vision.dim),
        "v_proj": (cfg.embed_dim, cfg.vision.dim),
        "t_tok_emb": (cfg.vocab_size, cfg.text.dim),
        "t_pos": (cfg.context, cfg.text.dim),
        "t_proj": (cfg.embed_dim, cfg.text.dim),
    }
    for name, shape in expected.items():
        if getattr(host, name).shape != shape:
            raise CheckpointError(
                f"{model_dir}: {name} has shape {getattr(host, name).shape}, config says {shape}"
            )
    gemms = tower_gemms(t, "vision_model", "v", cfg.vision)
    gemms.update(tower_gemms(t, "text_model", "t", cfg.text))
    return cfg, host, gemms


def layer_norm(x: np.ndarray, eps: float, affine: tuple[np.ndarray, np.ndarray] | None = None):
    """Row LayerNorm, float32: (x - mean) / sqrt(biased var + eps) [· w + b]. x: [rows, dim]."""
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True, dtype=np.float32)
    out = centred / np.sqrt(var + np.float32(eps))
    if affine is not None:
        out = out * affine[0] + affine[1]
    return out.astype(np.float32, copy=False)


def quick_gelu(x: np.ndarray) -> np.ndarray:
    """OpenAI CLIP's x·sigmoid(1.702·x), float32."""
    return (x * (0.5 * (1.0 + np.tanh(0.851 * x)))).astype(np.float32)


def run_tower(
    ops: Ops,
    key: str,
    cfg: TowerConfig,
    x: np.ndarray,
    regions: list[tuple[int, int]],
    causal: bool,
) -> np.ndarray:
    """Pre-LN transformer layers over rows x: float32 [rows, dim] -> [rows, dim].

    Attention runs once per region (start, length) of rows; rows outside every region (padding
    between a pass's slots) go through the GEMMs but are never attended to or read.
    """
    heads, hd = cfg.heads, cfg.head_dim
    scale = float(hd) ** -0.5
    x = x.astype(np.float32, copy=True)
    for i in range(cfg.layers):
        qkv = ops.gemm(f"{key}.{i}.qkv", layer_norm(x, cfg.eps))
        attn = np.zeros((x.shape[0], cfg.dim), dtype=np.float32)
        for start, length in regions:
            part = qkv[start : start + length].reshape(length, 3, heads, hd)
            q, k, v = (np.ascontiguousarray(part[:, j].transpose(1, 0, 2)) for j in range(3))
            o = ops.mha(f"{key}.mha", q, k, v, scale=scale, causal=causal)
            attn[start : start + length] = o.transpose(1, 0, 2).reshape(length, cfg.dim)
        x += ops.gemm(f"{key}.{i}.o", attn)
        h = ops.gemm(f"{key}.{i}.fc1", layer_norm(x, cfg.eps))
        if cfg.act == "quick_gelu":
            h = quick_gelu(h)
        x += ops.gemm(f"{key}.{i}.fc2", h)
    return x


def _normalise_rows(x: np.ndarray) -> np.ndarray:
    """Each row times 1/max(‖row‖, 1e-12) (spec b.8), in float64 for the norm."""
    norm = np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True))
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def logits_and_probs(
    image_embeds: np.ndarray, text_embeds: np.ndarray, logit_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """[ni, e], [nt, e] -> (logits [ni, nt] = scale·cos, softmax over prompts per image)."""
    logits = np.float32(logit_scale) * (
        _normalise_rows(image_embeds) @ _normalise_rows(text_embeds).T
    )
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted.astype(np.float64))
    return logits.astype(np.float32), (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


class TowerLayers(Protocol):
    """Runs one tower's transformer layers over one pass's rows."""

    backend: str

    def run(self, tower: str, x: np.ndarray) -> np.ndarray:
        """tower "v" or "t"; x: float32 [rows, dim] (a pass's slots at their strides, padding
        rows zero) -> float32 [rows, dim], the residual stream after the last layer."""
        ...


class OpsLayers:
    """run_tower over an npu.ops backend; attention per (start, length) region of each tower."""

    def __init__(
        self, ops: Ops, cfg: ClipConfig, regions: dict[str, list[tuple[int, int]]]
    ) -> None:
        self.ops = ops
        self.backend = ops.backend
        self._towers = {"v": (cfg.vision, False), "t": (cfg.text, True)}
        self._regions = regions

    def run(self, tower: str, x: np.ndarray) -> np.ndarray:
        cfg, causal = self._towers[tower]
        return run_tower(self.ops, tower, cfg, x, self._regions[tower], causal)


class ClipTowers:
    """Both towers: host glue around a TowerLayers backend.

    v_stride / t_stride: row pitch of an image's tokens / a prompt's tokens in a pass (the
    bundle's 264 and t_seq_pad; on cpu the token counts). v_batch / t_batch: images / prompts
    per pass; a smaller request still runs a full pass and its padded slots are dropped.
    """

    def __init__(
        self,
        cfg: ClipConfig,
        host: HostWeights,
        layers: TowerLayers,
        *,
        v_stride: int | None = None,
        t_stride: int | None = None,
        v_batch: int = V_BATCH,
        t_batch: int = T_BATCH,
    ) -> None:
        self.cfg = cfg
        self.host = host
        self.layers = layers
        self.v_stride = v_stride or cfg.v_tokens
        self.t_stride = t_stride or cfg.context
        self.v_batch = v_batch
        self.t_batch = t_batch
        if self.v_stride < cfg.v_tokens or self.t_stride < cfg.context:
            raise CheckpointError(
                f"strides {self.v_stride}/{self.t_stride} are below the token counts "
                f"{cfg.v_tokens}/{cfg.context}"
            )
        if v_batch < 1 or t_batch < 1:
            raise CheckpointError(f"batch sizes {v_batch}/{t_batch} must be >= 1")

    @classmethod
    def on_ops(cls, cfg: ClipConfig, host: HostWeights, ops: Ops) -> ClipTowers:
        """Towers over an npu.ops backend (cpu): rows at the token counts, attention per
        image over its tokens and per prompt over its context, causal."""
        regions = {
            "v": [(im * cfg.v_tokens, cfg.v_tokens) for im in range(V_BATCH)],
            "t": [(p * cfg.context, cfg.context) for p in range(T_BATCH)],
        }
        return cls(cfg, host, OpsLayers(ops, cfg, regions))

    @property
    def backend(self) -> str:
        return self.layers.backend

    def _patch_rows(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [n, 3, S, S] -> [n·grid², 3·p·p] patches, columns (channel, ky, kx)."""
        n, p, g = pixels.shape[0], self.cfg.patch, self.cfg.grid
        s = g * p
        x = pixels[:, :, :s, :s].reshape(n, 3, g, p, g, p).transpose(0, 2, 4, 1, 3, 5)
        return x.reshape(n * g * g, 3 * p * p)

    def _image_pass(self, pixels: np.ndarray) -> np.ndarray:
        """One full pass: float32 [v_batch, 3, S, S] -> [v_batch, embed]."""
        cfg, host, nb = self.cfg, self.host, self.v_batch
        tokens, stride, dim = cfg.v_tokens, self.v_stride, cfg.vision.dim
        emb = (self._patch_rows(pixels) @ host.v_patch_w.T).reshape(nb, tokens - 1, dim)
        x = np.zeros((nb * stride, dim), dtype=np.float32)
        for im in range(nb):
            rows = slice(im * stride, im * stride + tokens)
            x[rows] = np.concatenate([host.v_cls[None], emb[im]]) + host.v_pos
            x[rows] = layer_norm(x[rows], cfg.vision.eps, host.v_ln_pre)
        x = self.layers.run("v", x)
        cls = layer_norm(x[0 : nb * stride : stride], cfg.vision.eps, host.v_ln_post)
        return cls @ host.v_proj.T

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [n, 3, S, S] -> image embeddings float32 [n, embed] (projected, not normed)."""
        size = self.cfg.image_size
        if (
            not isinstance(pixels, np.ndarray)
            or pixels.ndim != 4
            or pixels.shape[1:]
            != (
                3,
                size,
                size,
            )
        ):
            shape = getattr(pixels, "shape", None)
            raise EncodeInputError(f"pixels must be float32 [n, 3, {size}, {size}], got {shape}")
        if pixels.shape[0] == 0:
            raise EncodeInputError("no images to encode")
        pixels = pixels.astype(np.float32, copy=False)
        out = []
        for start in range(0, pixels.shape[0], self.v_batch):
            group = pixels[start : start + self.v_batch]
            full = np.zeros((self.v_batch, 3, size, size), dtype=np.float32)
            full[: len(group)] = group
            out.append(self._image_pass(full)[: len(group)])
        return np.concatenate(out).astype(np.float32)

    def _pool_index(self, ids: np.ndarray) -> np.ndarray:
        """Per prompt, the row HF pools: argmax id (legacy eos_token_id == 2) or first eos."""
        if self.cfg.eos_token_id == 2:
            return ids.argmax(axis=1)
        return (ids == self.cfg.eos_token_id).argmax(axis=1)

    def _text_pass(self, ids: np.ndarray) -> np.ndarray:
        """One full pass: int [t_batch, context] -> [t_batch, embed]."""
        cfg, host, nb = self.cfg, self.host, self.t_batch
        ctx, stride = cfg.context, self.t_stride
        x = np.zeros((nb * stride, cfg.text.dim), dtype=np.float32)
        for p in range(nb):
            x[p * stride : p * stride + ctx] = host.t_tok_emb[ids[p]] + host.t_pos
        x = self.layers.run("t", x)
        rows = np.arange(nb) * stride + self._pool_index(ids)
        pooled = layer_norm(x[rows], cfg.text.eps, host.t_ln_final)
        return pooled @ host.t_proj.T

    def encode_texts(self, ids: np.ndarray) -> np.ndarray:
        """int [n, context] token ids (padded) -> text embeddings float32 [n, embed]."""
        ids = np.asarray(ids)
        ctx = self.cfg.context
        if ids.ndim != 2 or ids.shape[1] != ctx or not np.issubdtype(ids.dtype, np.integer):
            raise EncodeInputError(f"token ids must be integers [n, {ctx}], got {ids.shape}")
        if ids.shape[0] == 0:
            raise EncodeInputError("no texts to encode")
        bad = (ids < 0) | (ids >= self.cfg.vocab_size)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise EncodeInputError(
                f"token id {ids[row, col]} at [{row}, {col}] is outside the vocabulary "
                f"of {self.cfg.vocab_size}"
            )
        out = []
        for start in range(0, ids.shape[0], self.t_batch):
            group = ids[start : start + self.t_batch]
            full = np.zeros((self.t_batch, ctx), dtype=np.int64)
            full[: len(group)] = group
            out.append(self._text_pass(full)[: len(group)])
        return np.concatenate(out).astype(np.float32)
