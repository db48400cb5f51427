"""A torch IR network per docs/face-id.md (cvlface's Backbone / BasicBlockIR), for tests only.

Built here, independently of npu.models.adaface, with random weights and random BatchNorm
statistics, so the numpy forward's BN folding and step lowering are actually exercised.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class BasicBlockIR(nn.Module):
    def __init__(self, in_c: int, depth: int, stride: int) -> None:
        super().__init__()
        if in_c == depth:
            self.shortcut_layer = nn.MaxPool2d(1, stride)
        else:
            self.shortcut_layer = nn.Sequential(
                nn.Conv2d(in_c, depth, 1, stride, bias=False), nn.BatchNorm2d(depth)
            )
        self.res_layer = nn.Sequential(
            nn.BatchNorm2d(in_c),
            nn.Conv2d(in_c, depth, 3, 1, 1, bias=False),
            nn.BatchNorm2d(depth),
            nn.PReLU(depth),
            nn.Conv2d(depth, depth, 3, stride, 1, bias=False),
            nn.BatchNorm2d(depth),
        )

    def forward(self, x):
        return self.res_layer(x) + self.shortcut_layer(x)


class Backbone(nn.Module):
    def __init__(self, stem: int, widths, units, embed: int = 512) -> None:
        super().__init__()
        self.input_layer = nn.Sequential(
            nn.Conv2d(3, stem, 3, 1, 1, bias=False), nn.BatchNorm2d(stem), nn.PReLU(stem)
        )
        mods = []
        in_c = stem
        for w, n in zip(widths, units, strict=True):
            for j in range(n):
                mods.append(BasicBlockIR(in_c, w, 2 if j == 0 else 1))
                in_c = w
        self.body = nn.Sequential(*mods)
        self.output_layer = nn.Sequential(
            nn.BatchNorm2d(in_c),
            nn.Dropout(0.4),
            nn.Flatten(),
            nn.Linear(in_c * 7 * 7, embed),
            nn.BatchNorm1d(embed, affine=False),
        )

    def forward(self, x):
        return self.output_layer(self.body(self.input_layer(x)))


def tiny_ir(seed: int = 0, stem=8, widths=(8, 16, 24, 32), units=(1, 1, 1, 1)) -> Backbone:
    """A small random IR network in eval mode with non-trivial BN statistics and PReLUs."""
    torch.manual_seed(seed)
    net = Backbone(stem, widths, units)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
            elif isinstance(m, nn.PReLU):
                m.weight.uniform_(0.0, 0.5)
    return net.eval()


def save_cvlface_dir(net: Backbone, path: Path, prefix: str = "net.", **config) -> Path:
    """Write net as a cvlface-style model dir: model.safetensors (+ config.json)."""
    import json

    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    sd = {prefix + k: v.contiguous() for k, v in net.state_dict().items()}
    save_file(sd, str(path / "model.safetensors"))
    if config:
        (path / "config.json").write_text(json.dumps(config))
    return path
