"""HF CLIPModel checkpoints (config.json + safetensors, numpy API) -> the towers' GEMM weights
(LN1 / LN2 affines folded into qkv / fc1) and host tensors, for the cpu backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors import safe_open

from npu.models.clip.config import CheckpointError, ClipConfig, TowerConfig
from npu.models.clip.model import ClipInputError, ClipModel, ClipTowers, HostWeights
from npu.models.clip.tokenizer import Tokenizer
from npu.ops import GemmWeights, NumpyOps


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


BACKENDS = ("cpu",)


def from_pretrained(model_dir: str | Path, backend: str = "cpu") -> ClipModel:
    """HF CLIPModel directory: config.json, *.safetensors, and vocab.json + merges.txt
    (or the tokenizer.json transformers v5 saves)."""
    if backend not in BACKENDS:
        raise ClipInputError(
            f"backend {backend!r} cannot load an HF checkpoint; expected one of {BACKENDS}"
        )
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    cfg, host, gemms = load_checkpoint(model_dir)
    tokenizer = Tokenizer.from_dir(model_dir, context_length=cfg.context)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{model_dir}: tokenizer has {tokenizer.vocab_size} ids, model {cfg.vocab_size}"
        )
    return ClipModel(ClipTowers.on_ops(cfg, host, NumpyOps(gemms)), tokenizer)
