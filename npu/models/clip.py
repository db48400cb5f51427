"""CLIP zero-shot classification: HF CLIPTokenizer ids, CLIPImageProcessor pixels, both towers.

The public CLIP API, gathered from its modules: `Tokenizer` (clip_tokenizer), `preprocess`
(clip_preprocess), the towers (clip_towers), `ClipModel` (clip_model: an HF CLIPModel
directory on the cpu backend), `load_bundle` (clip_bundle: a CLIP bundle, spec b.2, on the
simulated or real NPU), `write_sim_bundle` (clip_export: a checkpoint as a bundle the
simulator runs) and `check_bundle` (clip_check: a bundle's self-test records with spec b.9's
gates).
"""

from __future__ import annotations

from npu.models.clip_bundle import load_bundle
from npu.models.clip_check import CheckLine, check_bundle
from npu.models.clip_export import write_sim_bundle
from npu.models.clip_model import (
    DEFAULT_TEMPLATE,
    ClipInputError,
    ClipModel,
    ZeroShot,
    prompts_for,
)
from npu.models.clip_preprocess import (
    CROP,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    RESIZE_SHORTEST,
    ImageInputError,
    axis_weights,
    check_image,
    normalize,
    preprocess,
    resize_crop,
    resized_size,
)
from npu.models.clip_tokenizer import (
    BOS_TOKEN,
    CONTEXT_LENGTH,
    EOS_TOKEN,
    Tokenizer,
    TokenizerError,
    bytes_to_unicode,
)
from npu.models.clip_towers import (
    T_BATCH,
    V_BATCH,
    CheckpointError,
    ClipConfig,
    ClipTowers,
    EncodeInputError,
    HostWeights,
    TowerConfig,
    layer_norm,
    load_checkpoint,
    logits_and_probs,
    run_tower,
)

__all__ = [
    "BOS_TOKEN",
    "CONTEXT_LENGTH",
    "CROP",
    "DEFAULT_TEMPLATE",
    "EOS_TOKEN",
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "RESIZE_SHORTEST",
    "T_BATCH",
    "V_BATCH",
    "CheckLine",
    "CheckpointError",
    "ClipConfig",
    "ClipInputError",
    "ClipModel",
    "ClipTowers",
    "EncodeInputError",
    "HostWeights",
    "ImageInputError",
    "Tokenizer",
    "TokenizerError",
    "TowerConfig",
    "ZeroShot",
    "axis_weights",
    "bytes_to_unicode",
    "check_bundle",
    "check_image",
    "layer_norm",
    "load_bundle",
    "load_checkpoint",
    "logits_and_probs",
    "normalize",
    "preprocess",
    "prompts_for",
    "resize_crop",
    "resized_size",
    "run_tower",
    "write_sim_bundle",
]
