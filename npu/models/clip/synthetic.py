"""The synthetic CLIP: the real tokenizer (open_clip's bpe_simple_vocab_16e6 vocabulary, 49408
ids), 224 x 224 images, 4 images / 8 prompts a pass, one layer per tower of width 32, 64-d
embeddings, random weights from a fixed seed (npu.models.synthetic); its outputs mean nothing.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from npu.models.clip.model import ClipModel
from npu.models.clip.tokenizer import bytes_to_unicode
from npu.models.synthetic import cache_root, normal, written_once
from pipeline.assets import asset_path

MODEL_ID = "clip-synthetic"
VERSION = 3  # bump when the model or bundle changes (cached checkpoints, bundles rebuilt)
SEED = 22
BPE_ASSET = "bpe_simple_vocab_16e6.txt.gz"
BPE_MERGES = 49152 - 256 - 2  # open_clip's merge count (its vocabulary is 49408)
CONFIG = {
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


def vocab(dest: Path) -> None:
    """vocab.json + merges.txt in dest, built from open_clip's bpe_simple_vocab_16e6 as
    open_clip and HF build CLIP's vocabulary: the 256 byte symbols, the same with `</w>`,
    one token per merge, then <|startoftext|> and <|endoftext|> (49408 ids)."""
    text = gzip.decompress(asset_path(BPE_ASSET).read_bytes()).decode("utf-8")
    merges = [tuple(line.split()) for line in text.split("\n")[1 : BPE_MERGES + 1]]
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(tokens)}
    (dest / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    body = "".join(f"{a} {b}\n" for a, b in merges)
    (dest / "merges.txt").write_text("#version: 0.2\n" + body, encoding="utf-8")


def state_dict(seed: int = SEED) -> dict[str, np.ndarray]:
    """Random tensors under HF CLIPModel's names for CONFIG."""
    rng = np.random.default_rng(seed)
    v, t = CONFIG["vision_config"], CONFIG["text_config"]
    embed = CONFIG["projection_dim"]
    sd: dict[str, np.ndarray] = {}

    def tower(prefix: str, cfg: dict) -> None:
        d, m = cfg["hidden_size"], cfg["intermediate_size"]
        for i in range(cfg["num_hidden_layers"]):
            p = f"{prefix}.encoder.layers.{i}."
            for n in ("q", "k", "v", "out"):
                sd[p + f"self_attn.{n}_proj.weight"] = normal(rng, d, d, scale=d**-0.5)
                sd[p + f"self_attn.{n}_proj.bias"] = normal(rng, d, scale=0.02)
            for n in ("layer_norm1", "layer_norm2"):
                sd[p + n + ".weight"] = 1.0 + normal(rng, d, scale=0.1)
                sd[p + n + ".bias"] = normal(rng, d, scale=0.02)
            sd[p + "mlp.fc1.weight"] = normal(rng, m, d, scale=d**-0.5)
            sd[p + "mlp.fc1.bias"] = normal(rng, m, scale=0.02)
            sd[p + "mlp.fc2.weight"] = normal(rng, d, m, scale=m**-0.5)
            sd[p + "mlp.fc2.bias"] = normal(rng, d, scale=0.02)

    vd, p = v["hidden_size"], v["patch_size"]
    tokens = (v["image_size"] // p) ** 2 + 1
    e = "vision_model.embeddings."
    sd[e + "patch_embedding.weight"] = normal(rng, vd, 3, p, p, scale=(3 * p * p) ** -0.5)
    sd[e + "class_embedding"] = normal(rng, vd, scale=0.5)
    sd[e + "position_embedding.weight"] = normal(rng, tokens, vd, scale=0.1)
    for n in ("vision_model.pre_layrnorm", "vision_model.post_layernorm"):
        sd[n + ".weight"] = 1.0 + normal(rng, vd, scale=0.1)
        sd[n + ".bias"] = normal(rng, vd, scale=0.02)
    tower("vision_model", v)
    sd["visual_projection.weight"] = normal(rng, embed, vd, scale=vd**-0.5)
    td = t["hidden_size"]
    sd["text_model.embeddings.token_embedding.weight"] = normal(rng, t["vocab_size"], td)
    sd["text_model.embeddings.position_embedding.weight"] = normal(
        rng, t["max_position_embeddings"], td, scale=0.1
    )
    sd["text_model.final_layer_norm.weight"] = 1.0 + normal(rng, td, scale=0.1)
    sd["text_model.final_layer_norm.bias"] = normal(rng, td, scale=0.02)
    tower("text_model", t)
    sd["text_projection.weight"] = normal(rng, embed, td, scale=td**-0.5)
    sd["logit_scale"] = np.asarray(np.log(100.0), np.float32)
    return sd


def write_checkpoint(dest: Path, seed: int = SEED) -> Path:
    """An HF CLIPModel directory (config.json, model.safetensors, vocab.json, merges.txt)."""
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "clip", "name": MODEL_ID, **CONFIG}
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    save_file(state_dict(seed), str(dest / "model.safetensors"))
    vocab(dest)
    return dest


def checkpoint_path(cache: str | Path | None = None) -> Path:
    """The synthetic CLIP's HF directory in the cache (written on first use)."""
    path = cache_root(cache) / f"clip-checkpoint-v{VERSION}"
    return written_once(path, write_checkpoint)


def cpu(cache: str | Path | None = None) -> ClipModel:
    from npu.models.clip.checkpoint import from_pretrained

    return from_pretrained(checkpoint_path(cache))


def write_bundle(out: Path, cache: str | Path | None = None) -> Path:
    from npu.models.clip.export import write_sim_bundle

    return write_sim_bundle(checkpoint_path(cache), out, v_stride=64)
