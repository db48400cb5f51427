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


# Sapiens2's two bundle layouts at reduced width and depth (real: 0.4b D 1024, 24 layers;
# 1b D 1536, 40 layers; both 16x64 / 24x64 heads, 8 registers, 308 keypoints): head dim 64,
# 8 registers, MHA + GQA layers and 308 keypoints as the real models; widths scaled by 1/4
# (0.4b) and 1/4 (1b, head up = (1536, 1024) / 4, convs = (768, 512, 256) / 4), depth 3 (full
# attention, GQA with heads / 2 kv heads, full), a 64 x 48 crop (21 tokens; real 1024 x 768,
# 3081 tokens) so that HF's torch forward and the simulator stay fast on a CPU.
LAYOUT_04B = dict(
    hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads_per_layer=[4, 2, 4], num_register_tokens=8, image_size=[64, 48],
    patch_size=16, layerscale_value=0.5, num_labels=308,
    head_config={"upsample_out_channels": [256, 128], "conv_out_channels": [128, 64]},
)  # fmt: skip
LAYOUT_1B = dict(
    hidden_size=384, intermediate_size=1536, num_hidden_layers=3, num_attention_heads=6,
    num_key_value_heads_per_layer=[6, 3, 6], num_register_tokens=8, image_size=[64, 48],
    patch_size=16, layerscale_value=0.5, num_labels=308,
    head_config={"upsample_out_channels": [384, 256], "conv_out_channels": [192, 128, 64]},
)  # fmt: skip


def peaked_heatmaps(model, gain: float = 8.0, seed: int = 0):
    """Make a random model's heatmaps peak where a crop is brightest, in place; returns it.

    A random model's heatmaps are noise, on which DARK's Newton step is ill-conditioned
    (keypoints jump by hundreds of pixels under bf16 rounding), so keypoint gates cannot be
    checked on them. Here the patch embedding carries each patch's mean brightness m along a
    direction a (x = m·a + b, b ⟂ a), the head reads that component back (deconvs: the
    bilinear 4x4 kernel on a, then channel averages; 1x1 convs and the predictor: averages),
    so every heatmap is one smooth bump over the bright region. The transformer layers keep
    their random weights, their attention and MLP outputs scaled by `gain` so they move the
    features (and so the heatmaps) visibly: the sim must still get them right.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        emb = model.model.embeddings.patch_embeddings
        d = emb.weight.shape[0]
        a, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
        b -= (b @ a) / (a @ a) * a
        a, b = 3 * a / a.norm() * d**0.5, 3 * b / b.norm() * d**0.5
        emb.weight.copy_(a[:, None, None, None].expand_as(emb.weight) / emb.weight[0].numel())
        emb.bias.copy_(b)
        model.model.norm.weight.fill_(1.0)
        for layer in model.model.model.layer:
            layer.attention.o_proj.weight.mul_(gain)
            layer.mlp.down_proj.weight.mul_(gain)
        k1 = torch.tensor([1.0, 3.0, 3.0, 1.0])
        kernel = torch.outer(k1, k1) / 16
        head = model.decode_head
        for j, up in enumerate(head.upsample_layers):
            w = up.convolution.weight  # [in, out, 4, 4]
            rows = a / a.norm() if j == 0 else torch.full((w.shape[0],), 1.0 / w.shape[0])
            w.copy_(rows[:, None, None, None] * kernel[None, None].expand_as(w))
        for conv in (*(c.convolution for c in head.conv_layers), head.predictor):
            conv.weight.fill_(1.0 / conv.weight.shape[1])
            conv.bias.zero_()
        head.predictor.weight.mul_(0.4)
        head.predictor.bias.copy_(0.05 * torch.randn(head.predictor.bias.shape, generator=g))
    return model


def blob_image(h: int = 300, w: int = 220, centres=((90, 80), (200, 150)), sigma: float = 18.0):
    """uint8 RGB [h, w, 3]: a dark image with bright Gaussian blobs at centres (y, x)."""
    import numpy as np

    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    v = sum(np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma**2)) for cy, cx in centres)
    grey = 20 + 215 * np.clip(v, 0, 1)
    rgb = np.stack([grey, 0.9 * grey, 0.8 * grey], axis=-1)
    return rgb.round().astype(np.uint8)
