"""Hugging Face Sapiens2ForPoseEstimation checkpoints -> the forward's GEMM weights and host
tensors (norm weights folded into B, LayerScale into o), on the cpu backend."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from npu.models.sapiens2.config import Config, ModelError
from npu.models.sapiens2.model import KeyedOps, Sapiens2Pose, rope_tables
from npu.ops import GemmWeights, NumpyOps


def deconv_weights(wt: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """ConvTranspose2d(k4 s2 p1) weight [C, C_out, 4, 4] -> the 4-phase GEMM B [4C, 4·C_out].

    B[(2dx+dy)·C + ci, (2a+b)·C_out + co] = Wt[ci, co, 3-2dy-a, 3-2dx-b] (docs/pose.md), rows
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
    return Sapiens2Pose(cfg, KeyedOps(NumpyOps(gemms), cfg), host, weights=gemms)
