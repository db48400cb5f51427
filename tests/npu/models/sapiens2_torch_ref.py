"""A tiny random-weight HF Sapiens2ForPoseEstimation (torch, test-only) and its saved copy.

Not a conftest.py: a conftest here would make pytest resolve `npu` to tests/npu.
"""

from __future__ import annotations

import torch


def tiny_sapiens2_config(**overrides):
    """A small Sapiens2 pose config: 2 layers, width 64 (4 heads x 16), layer 1 GQA (2 kv
    heads), 2 registers, 64 x 48 input (4 x 3 patches), head 32/16 deconvs, 16/8 convs, 17
    keypoints."""
    from transformers import Sapiens2Config

    kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads_per_layer=[4, 2],
        num_register_tokens=2,
        image_size=[64, 48],
        patch_size=16,
        layerscale_value=0.5,
        head_config={"upsample_out_channels": [32, 16], "conv_out_channels": [16, 8]},
        num_labels=17,
    )
    kwargs.update(overrides)
    return Sapiens2Config(**kwargs)


def tiny_sapiens2(seed: int = 0, **overrides):
    """The tiny model in eval mode with every parameter randomised (norm weights and layer
    scales too, so weight folding is exercised)."""
    from transformers import Sapiens2ForPoseEstimation

    torch.manual_seed(seed)
    model = Sapiens2ForPoseEstimation(tiny_sapiens2_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight", "norm.weight", "lambda1")):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "decode_head" in name and name.endswith("bias") or name.endswith("_proj.bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith(("cls_token", "register_tokens")):
                p.copy_(torch.randn_like(p))
    return model


def save_tiny_sapiens2(path, seed: int = 0, **overrides):
    """Save the tiny model with save_pretrained (config.json + safetensors); returns it."""
    torch.set_num_threads(1)
    model = tiny_sapiens2(seed, **overrides)
    model.save_pretrained(path)
    return model
