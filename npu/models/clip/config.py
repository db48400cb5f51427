"""CLIP sizes as HF CLIPConfig names them (config.json), with the pass sizes taconite-clip's
bundles use: 4 images and 8 prompts a pass (docs/clip.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import NpucamError

V_BATCH = 4


T_BATCH = 8


ACTIVATIONS = ("gelu", "quick_gelu")


class CheckpointError(NpucamError):
    """A CLIP checkpoint directory is missing a file, a tensor or a supported setting."""


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
