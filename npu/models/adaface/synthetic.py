"""The synthetic AdaFace IR: a 112 x 112 aligned face -> a 512-d embedding through 4 one-unit
stages of widths 8-32, random weights from a fixed seed (npu.models.synthetic); its outputs
mean nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npu.models.adaface.checkpoint import lower_iresnet
from npu.models.adaface.model import AdaFaceCpu
from npu.models.synthetic import normal

MODEL_ID = "IR-synthetic"
VERSION = 2  # bump when the model changes, so cached bundles are rebuilt
SEED = 21
EMBED_DIM = 512
STEM = 8
WIDTHS = (16, 16, 32, 32)  # one unit per stage: 112 -> 56 -> 28 -> 14 -> 7


def _bn(sd: dict, prefix: str, c: int, rng: np.random.Generator, affine: bool = True) -> None:
    sd[prefix + "running_mean"] = normal(rng, c, scale=0.1)
    sd[prefix + "running_var"] = (1.0 + np.abs(normal(rng, c, scale=0.2))).astype(np.float32)
    if affine:
        sd[prefix + "weight"] = 1.0 + normal(rng, c, scale=0.1)
        sd[prefix + "bias"] = normal(rng, c, scale=0.1)


def state_dict(seed: int = SEED) -> dict[str, np.ndarray]:
    """A cvlface-style iresnet state dict (the names lower_iresnet reads)."""
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}
    sd["input_layer.0.weight"] = normal(rng, STEM, 3, 3, 3, scale=27**-0.5)
    _bn(sd, "input_layer.1.", STEM, rng)
    sd["input_layer.2.weight"] = np.full(STEM, 0.25, np.float32)
    width = STEM
    for i, depth in enumerate(WIDTHS):
        p = f"body.{i}."
        _bn(sd, p + "res_layer.0.", width, rng)
        sd[p + "res_layer.1.weight"] = normal(rng, depth, width, 3, 3, scale=(9 * width) ** -0.5)
        _bn(sd, p + "res_layer.2.", depth, rng)
        sd[p + "res_layer.3.weight"] = np.full(depth, 0.25, np.float32)
        sd[p + "res_layer.4.weight"] = normal(rng, depth, depth, 3, 3, scale=(9 * depth) ** -0.5)
        _bn(sd, p + "res_layer.5.", depth, rng)
        if depth != width:
            sd[p + "shortcut_layer.0.weight"] = normal(rng, depth, width, 1, 1, scale=width**-0.5)
            _bn(sd, p + "shortcut_layer.1.", depth, rng)
        width = depth
    flat = width * 7 * 7
    _bn(sd, "output_layer.0.", width, rng)
    sd["output_layer.3.weight"] = normal(rng, EMBED_DIM, flat, scale=flat**-0.5)
    sd["output_layer.3.bias"] = normal(rng, EMBED_DIM, scale=0.01)
    _bn(sd, "output_layer.4.", EMBED_DIM, rng, affine=False)
    return sd


def build(seed: int = SEED):
    """The tiny AdaFace IR on the cpu backend (AdaFaceCpu, rgb order)."""
    units = (1,) * len(WIDTHS)
    program = lower_iresnet(state_dict(seed), MODEL_ID, units)
    return AdaFaceCpu(program, "rgb")


def cpu(cache: str | Path | None = None) -> AdaFaceCpu:
    return build()


def write_bundle(out: Path, cache: str | Path | None = None) -> Path:
    from npu.models.adaface.export import export_bundle

    model = build()
    x = np.random.default_rng(0).uniform(-1, 1, (3, 112, 112)).astype(np.float32)
    return export_bundle(model.program, out, x, model=MODEL_ID)
