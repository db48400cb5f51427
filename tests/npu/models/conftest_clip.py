"""Shared CLIP test fixtures: a real CLIP vocabulary and tiny random HF CLIPModel directories.

The vocabulary is built from open_clip's bpe_simple_vocab_16e6.txt.gz exactly as open_clip and
HF build it. Test modules import the fixtures they use (`from conftest_clip import ...`).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from npu.models.clip.tokenizer import bytes_to_unicode
from pipeline.assets import asset_path


def write_vocab(dest: Path) -> Path:
    """vocab.json + merges.txt from bpe_simple_vocab_16e6.txt.gz into dest; returns dest."""
    lines = gzip.decompress(asset_path("bpe_simple_vocab_16e6.txt.gz").read_bytes())
    lines = lines.decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1 : 49152 - 256 - 2 + 1]]
    vocab = list(bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "vocab.json").write_text(
        json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False), encoding="utf-8"
    )
    (dest / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n", encoding="utf-8"
    )
    return dest


def write_tiny_clip(dest: Path, *, hidden_act: str = "gelu", eos_token_id: int = 49407) -> Path:
    """A tiny random-weight HF CLIPModel (patch 14 -> 257 tokens, real 49408 vocab) in dest."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=49408,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            hidden_act=hidden_act,
            eos_token_id=eos_token_id,
        ),
        vision_config=dict(
            hidden_size=40,
            intermediate_size=80,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=224,
            patch_size=14,
            hidden_act=hidden_act,
        ),
        projection_dim=24,
    )
    model = CLIPModel(config).eval()
    # HF's init (std 0.02, identity LayerNorms, zero biases) makes embeddings nearly
    # input-independent; redraw weights at 1/sqrt(fan_in) and randomise LN affines and biases,
    # so embeddings differ per input and the folding of LN affines into GEMMs is exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "logit_scale":
                continue
            if "layer_norm" in name or "layrnorm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embedding" in name and p.ndim == 2 and "patch" not in name:
                p.copy_(torch.randn_like(p))
            elif p.ndim >= 2:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
            else:
                p.copy_(torch.randn_like(p))
    model.save_pretrained(dest, safe_serialization=True)
    write_vocab(dest)
    return dest


@pytest.fixture(scope="session")
def clip_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_vocab(tmp_path_factory.mktemp("clip_vocab"))


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="session")
def tiny_clip_quick_gelu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenAI-style: quick_gelu activations and the legacy eos_token_id=2 (argmax pooling)."""
    return write_tiny_clip(
        tmp_path_factory.mktemp("tiny_clip_qg"), hidden_act="quick_gelu", eos_token_id=2
    )
