"""Small synthetic-weight models with the real interfaces, for demos and tests without weights.

Each model is built in numpy from a fixed seed (no torch): random weights at tiny widths and
depths, but the interfaces of the released models, so every stage downstream runs unchanged:

- Sapiens2-Pose: 308 keypoints from a 256 x 192 crop (64 x 48 heatmaps), 2 blocks of width 64.
- AdaFace IR: a 112 x 112 aligned face -> a 512-d embedding (4 one-unit stages, widths 8-32).
- CLIP: the real tokenizer (open_clip's bpe_simple_vocab_16e6 vocabulary, 49408 ids), 224 x
  224 images, 4 images / 8 prompts a pass, one layer per tower of width 32, 64-d embeddings.

Their outputs mean nothing; whatever publishes them says `synthetic: true`. Each is
available on the cpu backend (`load(name, "cpu")`) and, written once into a cache directory
as a bundle the simulated NPU runs (`bundle_path(name)`), on sim. The weights are the same on
both backends (the bundle is written from the cpu model).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import NpucamError

MODELS = ("sapiens2", "adaface", "clip")
VERSION = 2  # bump when a synthetic model changes, so cached bundles are rebuilt
SEEDS = {"sapiens2": 20, "adaface": 21, "clip": 22}
MODEL_NAMES = {
    "sapiens2": "sapiens2-synthetic",
    "adaface": "IR-synthetic",
    "clip": "clip-synthetic",
}
POSE_KEYPOINTS = 308
FACE_EMBED = 512
BPE_ASSET = "bpe_simple_vocab_16e6.txt.gz"
BPE_MERGES = 49152 - 256 - 2  # open_clip's merge count (its vocabulary is 49408)


class SyntheticError(NpucamError):
    """An unknown synthetic model or backend, or a cache directory that cannot be written."""


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# -- Sapiens2 ----------------------------------------------------------------------------


def sapiens2_config():
    """The tiny Sapiens2 config: 256 x 192 crops, patch 16, 2 blocks of width 64, K = 308."""
    from npu.models.sapiens2 import Config

    return Config(
        D=64, I=128, layers=2, heads=4, hd=16, kv_heads=(4, 2), regs=2, patch=16, H=256, W=192,
        eps=1e-6, in_eps=1e-5, up=(32, 32), convs=(32,), K=POSE_KEYPOINTS,
    )  # fmt: skip


def sapiens2_cpu(seed: int = SEEDS["sapiens2"]):
    """The tiny Sapiens2-Pose on the cpu backend (npu.models.sapiens2.Sapiens2Pose)."""
    from npu.models.sapiens2 import Sapiens2Pose, _valid_shapes, rope_tables
    from npu.ops import GemmWeights, NumpyOps

    cfg = sapiens2_config()
    rng = np.random.default_rng(seed)
    gemms = {}
    for key, (k, n) in _valid_shapes(cfg).items():
        epilogue = "swiglu" if key.endswith(".gu") else "none"
        cols = 2 * n if epilogue == "swiglu" else n
        bias = None if key.startswith("d") else _normal(rng, cols, scale=0.02)
        gemms[key] = GemmWeights(_normal(rng, k, cols, scale=k**-0.5), bias, epilogue)
    cos, sin = rope_tables(cfg)
    host = {"prefix": _normal(rng, cfg.prefix * cfg.D, scale=0.5)}
    host["rope.cos"], host["rope.sin"] = cos.reshape(-1), sin.reshape(-1)
    for i in range(cfg.layers):
        host[f"{i}.q_norm"] = 1.0 + _normal(rng, cfg.hd, scale=0.1)
        host[f"{i}.k_norm"] = 1.0 + _normal(rng, cfg.hd, scale=0.1)
    return Sapiens2Pose(cfg, NumpyOps(gemms), host, weights=gemms)


# -- AdaFace -----------------------------------------------------------------------------

ADAFACE_STEM = 8
ADAFACE_WIDTHS = (16, 16, 32, 32)  # one unit per stage: 112 -> 56 -> 28 -> 14 -> 7


def _bn(sd: dict, prefix: str, c: int, rng: np.random.Generator, affine: bool = True) -> None:
    sd[prefix + "running_mean"] = _normal(rng, c, scale=0.1)
    sd[prefix + "running_var"] = (1.0 + np.abs(_normal(rng, c, scale=0.2))).astype(np.float32)
    if affine:
        sd[prefix + "weight"] = 1.0 + _normal(rng, c, scale=0.1)
        sd[prefix + "bias"] = _normal(rng, c, scale=0.1)


def adaface_state_dict(seed: int = SEEDS["adaface"]) -> dict[str, np.ndarray]:
    """A cvlface-style iresnet state dict (the names npu.models.adaface.lower_iresnet reads)."""
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}
    sd["input_layer.0.weight"] = _normal(rng, ADAFACE_STEM, 3, 3, 3, scale=27**-0.5)
    _bn(sd, "input_layer.1.", ADAFACE_STEM, rng)
    sd["input_layer.2.weight"] = np.full(ADAFACE_STEM, 0.25, np.float32)
    width = ADAFACE_STEM
    for i, depth in enumerate(ADAFACE_WIDTHS):
        p = f"body.{i}."
        _bn(sd, p + "res_layer.0.", width, rng)
        sd[p + "res_layer.1.weight"] = _normal(rng, depth, width, 3, 3, scale=(9 * width) ** -0.5)
        _bn(sd, p + "res_layer.2.", depth, rng)
        sd[p + "res_layer.3.weight"] = np.full(depth, 0.25, np.float32)
        sd[p + "res_layer.4.weight"] = _normal(rng, depth, depth, 3, 3, scale=(9 * depth) ** -0.5)
        _bn(sd, p + "res_layer.5.", depth, rng)
        if depth != width:
            sd[p + "shortcut_layer.0.weight"] = _normal(rng, depth, width, 1, 1, scale=width**-0.5)
            _bn(sd, p + "shortcut_layer.1.", depth, rng)
        width = depth
    flat = width * 7 * 7
    _bn(sd, "output_layer.0.", width, rng)
    sd["output_layer.3.weight"] = _normal(rng, FACE_EMBED, flat, scale=flat**-0.5)
    sd["output_layer.3.bias"] = _normal(rng, FACE_EMBED, scale=0.01)
    _bn(sd, "output_layer.4.", FACE_EMBED, rng, affine=False)
    return sd


def adaface_cpu(seed: int = SEEDS["adaface"]):
    """The tiny AdaFace IR on the cpu backend (npu.models.adaface.AdaFaceCpu, rgb order)."""
    from npu.models.adaface import AdaFaceCpu, lower_iresnet

    units = (1,) * len(ADAFACE_WIDTHS)
    program = lower_iresnet(adaface_state_dict(seed), MODEL_NAMES["adaface"], units)
    return AdaFaceCpu(program, "rgb")


# -- CLIP --------------------------------------------------------------------------------

CLIP_CONFIG = {
    "projection_dim": 64,
    "vision_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "image_size": 224, "patch_size": 32, "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
    },
    "text_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "max_position_embeddings": 77, "vocab_size": 49408,
        "hidden_act": "gelu", "layer_norm_eps": 1e-5, "eos_token_id": 49407,
    },
}  # fmt: skip


def clip_vocab(dest: Path) -> None:
    """vocab.json + merges.txt in dest, built from open_clip's bpe_simple_vocab_16e6 as
    open_clip and HF build CLIP's vocabulary: the 256 byte symbols, the same with `</w>`,
    one token per merge, then <|startoftext|> and <|endoftext|> (49408 ids)."""
    from npu.models.clip_tokenizer import bytes_to_unicode
    from pipeline.assets import asset_path

    text = gzip.decompress(asset_path(BPE_ASSET).read_bytes()).decode("utf-8")
    merges = [tuple(line.split()) for line in text.split("\n")[1 : BPE_MERGES + 1]]
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(tokens)}
    (dest / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    body = "".join(f"{a} {b}\n" for a, b in merges)
    (dest / "merges.txt").write_text("#version: 0.2\n" + body, encoding="utf-8")


def clip_state_dict(seed: int = SEEDS["clip"]) -> dict[str, np.ndarray]:
    """Random tensors under HF CLIPModel's names for CLIP_CONFIG."""
    rng = np.random.default_rng(seed)
    v, t = CLIP_CONFIG["vision_config"], CLIP_CONFIG["text_config"]
    embed = CLIP_CONFIG["projection_dim"]
    sd: dict[str, np.ndarray] = {}

    def tower(prefix: str, cfg: dict) -> None:
        d, m = cfg["hidden_size"], cfg["intermediate_size"]
        for i in range(cfg["num_hidden_layers"]):
            p = f"{prefix}.encoder.layers.{i}."
            for n in ("q", "k", "v", "out"):
                sd[p + f"self_attn.{n}_proj.weight"] = _normal(rng, d, d, scale=d**-0.5)
                sd[p + f"self_attn.{n}_proj.bias"] = _normal(rng, d, scale=0.02)
            for n in ("layer_norm1", "layer_norm2"):
                sd[p + n + ".weight"] = 1.0 + _normal(rng, d, scale=0.1)
                sd[p + n + ".bias"] = _normal(rng, d, scale=0.02)
            sd[p + "mlp.fc1.weight"] = _normal(rng, m, d, scale=d**-0.5)
            sd[p + "mlp.fc1.bias"] = _normal(rng, m, scale=0.02)
            sd[p + "mlp.fc2.weight"] = _normal(rng, d, m, scale=m**-0.5)
            sd[p + "mlp.fc2.bias"] = _normal(rng, d, scale=0.02)

    vd, p = v["hidden_size"], v["patch_size"]
    tokens = (v["image_size"] // p) ** 2 + 1
    e = "vision_model.embeddings."
    sd[e + "patch_embedding.weight"] = _normal(rng, vd, 3, p, p, scale=(3 * p * p) ** -0.5)
    sd[e + "class_embedding"] = _normal(rng, vd, scale=0.5)
    sd[e + "position_embedding.weight"] = _normal(rng, tokens, vd, scale=0.1)
    for n in ("vision_model.pre_layrnorm", "vision_model.post_layernorm"):
        sd[n + ".weight"] = 1.0 + _normal(rng, vd, scale=0.1)
        sd[n + ".bias"] = _normal(rng, vd, scale=0.02)
    tower("vision_model", v)
    sd["visual_projection.weight"] = _normal(rng, embed, vd, scale=vd**-0.5)
    td = t["hidden_size"]
    sd["text_model.embeddings.token_embedding.weight"] = _normal(rng, t["vocab_size"], td)
    sd["text_model.embeddings.position_embedding.weight"] = _normal(
        rng, t["max_position_embeddings"], td, scale=0.1
    )
    sd["text_model.final_layer_norm.weight"] = 1.0 + _normal(rng, td, scale=0.1)
    sd["text_model.final_layer_norm.bias"] = _normal(rng, td, scale=0.02)
    tower("text_model", t)
    sd["text_projection.weight"] = _normal(rng, embed, td, scale=td**-0.5)
    sd["logit_scale"] = np.asarray(np.log(100.0), np.float32)
    return sd


def write_clip_checkpoint(dest: Path, seed: int = SEEDS["clip"]) -> Path:
    """An HF CLIPModel directory (config.json, model.safetensors, vocab.json, merges.txt)."""
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "clip", "name": MODEL_NAMES["clip"], **CLIP_CONFIG}
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    save_file(clip_state_dict(seed), str(dest / "model.safetensors"))
    clip_vocab(dest)
    return dest


# -- the cache ---------------------------------------------------------------------------


def cache_root(cache: str | Path | None = None) -> Path:
    """Where synthetic checkpoints and bundles live: `cache`, else <asset cache>/synthetic."""
    if cache is not None:
        return Path(cache)
    from pipeline.assets import cache_dir

    return cache_dir() / "synthetic"


def _written_once(path: Path, write: Any) -> Path:
    """Run write(tmp_dir) into a sibling temp dir and rename it to path, unless path exists
    (another process may have won the race: its copy is kept)."""
    if path.is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        staged = tmp / "out"
        write(staged)
        try:
            os.rename(staged, path)
        except OSError:
            if not path.is_dir():
                raise
    except OSError as exc:
        raise SyntheticError(f"{path}: cannot write the synthetic model: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def clip_checkpoint_path(cache: str | Path | None = None) -> Path:
    """The synthetic CLIP's HF directory in the cache (written on first use)."""
    path = cache_root(cache) / f"clip-checkpoint-v{VERSION}"
    return _written_once(path, write_clip_checkpoint)


def bundle_path(name: str, cache: str | Path | None = None) -> Path:
    """The synthetic model's sim bundle in the cache, written on first use."""
    if name not in MODELS:
        raise SyntheticError(f"no synthetic model {name!r} (known: {', '.join(MODELS)})")
    path = cache_root(cache) / f"{name}-bundle-v{VERSION}"
    if name == "sapiens2":
        from npu.models.sapiens2 import write_sim_bundle

        return _written_once(path, lambda out: write_sim_bundle(sapiens2_cpu(), out))
    if name == "adaface":
        from npu.models.adaface_export import export_bundle

        model = adaface_cpu()
        x = np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
        return _written_once(
            path,
            lambda out: export_bundle(model.program, out, x, model=MODEL_NAMES["adaface"]),
        )
    from npu.models.clip import write_sim_bundle as write_clip

    ckpt = clip_checkpoint_path(cache)
    return _written_once(path, lambda out: write_clip(ckpt, out, v_stride=64))


def load(name: str, backend: str, device: Any = None, cache: str | Path | None = None) -> Any:
    """A synthetic model on `backend`: "cpu" (numpy), or "sim" on `device` (an
    npu.sim.SimDevice; a new one if None). Sapiens2Pose, AdaFaceCpu / AdafaceBundle, ClipModel."""
    if name not in MODELS:
        raise SyntheticError(f"no synthetic model {name!r} (known: {', '.join(MODELS)})")
    if backend == "cpu":
        if name == "sapiens2":
            return sapiens2_cpu()
        if name == "adaface":
            return adaface_cpu()
        from npu.models.clip import ClipModel

        return ClipModel.from_pretrained(clip_checkpoint_path(cache))
    if backend != "sim":
        raise SyntheticError(
            f"synthetic {name}: backend {backend!r}; synthetic models run on cpu or sim only "
            "(hardware bundles come from IRON's exporter)"
        )
    if device is None:
        from npu.sim import SimDevice

        device = SimDevice()
    path = bundle_path(name, cache)
    if name == "sapiens2":
        from npu.models.sapiens2 import from_bundle

        return from_bundle(path, device)
    if name == "adaface":
        from npu.models.adaface_steps import AdafaceBundle

        return AdafaceBundle.load(path, device)
    from npu.models.clip import load_bundle

    return load_bundle(path, device)
