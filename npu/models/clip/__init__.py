"""CLIP ViT-H/14 zero-shot labels: an image crop and label prompts -> label probabilities.

Laid out as taconite-clip: config (sizes), tokenizer (CLIP BPE), preprocess (the image
processor), model (both towers and the loaded ClipModel), checkpoint (HF weights, cpu
backend), npu (the bundle's tower replay), export (sim bundles), post (the zero-shot
softmax), check (bundle self-check), synthetic. `MODEL` is its registry entry (npu.models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu.models import ModelSpec, RunsOn


def _from_checkpoint(path: Path) -> Any:
    from npu.models.clip.checkpoint import from_pretrained

    return from_pretrained(path)


def _from_bundle(path: Path, device: Any) -> Any:
    from npu.models.clip.npu import load_bundle

    return load_bundle(path, device)


MODEL = ModelSpec(
    name="clip",
    kind="clip",
    runtime="stages.models.clip.runtime:ClipRuntime",
    from_checkpoint=_from_checkpoint,
    from_bundle=_from_bundle,
    synthetic="npu.models.clip.synthetic",
    export_batch=lambda model, bundle_dir: int(model.towers.v_batch),
    default_batch=4,
    wire_meta=lambda: {"probabilities": "softmax over the labels of the message, in their order"},
    npu2="npu.models.clip.npu2",
    stands_in_for="vit-h-14",
    runs_on=RunsOn("region", "interval", interval_s=1.0, max_per_frame=4),
)
