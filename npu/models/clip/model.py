"""CLIP's two towers as HF CLIPModel's get_image_features / get_text_features.

The forwards follow taconite-clip's layout (docs/clip.md): host glue in float32 numpy (patch
embedding, ln_pre, token + position embeddings, pooling, ln_post / ln_final, projections)
around a `TowerLayers` backend that runs one tower's transformer layers over a pass's rows.
`OpsLayers` is that backend over npu.ops (the cpu backend: every projection a `gemm` by key
with LN1 / LN2 affines folded into the qkv / fc1 weights, attention an `mha` per image or per
prompt); npu.models.clip_bundle replays a bundle's kernels on a device. Images run in groups
of 4 and prompts in groups of 8 (the bundle's pass sizes); a partial group is padded and its
padded slots are dropped. Weights load from an HF checkpoint (config.json + *.safetensors,
read with safetensors' numpy API).

ClipModel (after the towers) is the loaded model: tokenizer, preprocessing and both towers on
one backend, classifying images against label prompts as HF does: logits = exp(logit_scale)
· cosine(image, prompt), softmax per image over prompts. npu.models.clip.checkpoint loads an
HF CLIPModel directory on the cpu backend; npu.models.clip.npu builds one over a bundle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from npu.models.clip.config import T_BATCH, V_BATCH, CheckpointError, ClipConfig, TowerConfig
from npu.models.clip.post import logits_and_probs
from npu.models.clip.preprocess import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    RESIZE_SHORTEST,
    check_image,
    normalize,
    resize_crop,
)
from npu.models.clip.tokenizer import Tokenizer
from npu.ops import Ops
from pipeline.errors import NpucamError


@dataclass(frozen=True)
class HostWeights:
    """Host-side float32 tensors (docs/clip.md names): the non-GEMM parts of both towers."""

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


class EncodeInputError(NpucamError):
    """Pixels or token ids the towers cannot take."""


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


DEFAULT_TEMPLATE = "a photo of a {}"


class ClipInputError(NpucamError):
    """A classify request the model cannot take (no labels, bad template, bad label)."""


@dataclass(frozen=True)
class ZeroShot:
    """Zero-shot result: probs / logits float32 [images, labels], rows sum to 1 (probs)."""

    labels: tuple[str, ...]
    prompts: tuple[str, ...]
    probs: np.ndarray
    logits: np.ndarray
    backend: str

    def top(self, image: int) -> tuple[str, float]:
        """(label, probability) of the most probable label of one image (first on ties)."""
        j = int(np.argmax(self.probs[image]))
        return self.labels[j], float(self.probs[image, j])


def prompts_for(labels: Sequence[str], template: str = DEFAULT_TEMPLATE) -> list[str]:
    """Labels -> prompts by substituting each label for `{}` in the template."""
    if isinstance(labels, str):
        raise ClipInputError("labels must be a list of strings, got one string")
    if len(labels) == 0:
        raise ClipInputError("the label list is empty")
    if not isinstance(template, str) or template.count("{}") != 1:
        raise ClipInputError(f"prompt template {template!r} must contain '{{}}' exactly once")
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not label.strip():
            raise ClipInputError(f"label {i} ({label!r}) is empty or not a string")
    return [template.replace("{}", label) for label in labels]


class ClipModel:
    """One loaded CLIP: tokenizer, preprocessing and both towers on one backend."""

    def __init__(
        self,
        towers: ClipTowers,
        tokenizer: Tokenizer,
        *,
        resize_shortest: int = RESIZE_SHORTEST,
        mean: tuple[float, float, float] = OPENAI_CLIP_MEAN,
        std: tuple[float, float, float] = OPENAI_CLIP_STD,
    ) -> None:
        self.towers = towers
        self.tokenizer = tokenizer
        self.resize_shortest = resize_shortest
        self.mean = mean
        self.std = std
        self._text_cache: tuple[tuple[str, ...], np.ndarray] | None = None
        self.template = DEFAULT_TEMPLATE
        self.bundle: Any = None

    @property
    def backend(self) -> str:
        return self.towers.backend

    @property
    def logit_scale(self) -> float:
        return self.towers.host.logit_scale

    def pixels(self, images_rgb: Sequence[np.ndarray]) -> np.ndarray:
        """uint8 RGB images [H, W, 3] -> float32 [n, 3, 224, 224] as CLIPImageProcessor."""
        if len(images_rgb) == 0:
            raise ClipInputError("no images to classify")
        crop = self.towers.cfg.image_size
        out = np.empty((len(images_rgb), 3, crop, crop), dtype=np.float32)
        for i, image in enumerate(images_rgb):
            check_image(image, what=f"image {i}")
            out[i] = normalize(resize_crop(image, self.resize_shortest, crop), self.mean, self.std)
        return out

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [n, 3, 224, 224] -> float32 [n, embed], HF get_image_features."""
        return self.towers.encode_images(pixels)

    def encode_texts(self, ids: np.ndarray | Sequence[Sequence[int]]) -> np.ndarray:
        """Token ids ([n, 77] padded, or a list of unpadded encodings) -> float32 [n, embed]."""
        if not isinstance(ids, np.ndarray):
            ids, _ = self.tokenizer.pad_ids([list(seq) for seq in ids])
        return self.towers.encode_texts(ids)

    def encode_prompts(self, prompts: Sequence[str]) -> np.ndarray:
        """Prompts -> float32 [n, embed]; a prompt without letters is an error."""
        ids = [self.tokenizer.encode_prompt(p, what=f"prompt {i}") for i, p in enumerate(prompts)]
        return self.encode_texts(ids)

    def label_embeddings(self, labels: Sequence[str], template: str | None = None) -> np.ndarray:
        """Text embeddings of the label prompts, cached until the labels or template change.

        template: `{}` is replaced by each label; default the model's (the bundle's
        prompt_template, else "a photo of a {}")."""
        prompts = tuple(prompts_for(labels, template or self.template))
        if self._text_cache is None or self._text_cache[0] != prompts:
            for i, label in enumerate(labels):
                self.tokenizer.encode_prompt(label, what=f"label {i}")  # letters required
            self._text_cache = (prompts, self.encode_prompts(prompts))
        return self._text_cache[1]

    def classify(
        self,
        images_rgb: Sequence[np.ndarray],
        labels: Sequence[str],
        template: str | None = None,
    ) -> ZeroShot:
        """Zero-shot: probabilities float32 [n_images, n_labels] over the label prompts."""
        template = template or self.template
        text = self.label_embeddings(labels, template)
        image = self.encode_images(self.pixels(images_rgb))
        logits, probs = logits_and_probs(image, text, self.logit_scale)
        return ZeroShot(
            labels=tuple(labels),
            prompts=tuple(prompts_for(labels, template)),
            probs=probs,
            logits=logits,
            backend=self.backend,
        )
