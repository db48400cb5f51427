"""AdaFace IR-18 / IR-101: a 5-point aligned 112 x 112 face -> a 512-d embedding for face-ID.

Laid out as taconite-adaface: config (constants), preprocess (aligned crop -> input), model
(the step program and its f32 forward), checkpoint (cvlface safetensors, cpu backend), npu
(the bundle's step replay), export (sim bundles), post (normalise, cosine), check (bundle
self-check), synthetic. `MODEL` is its registry entry (npu.models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu.models import ModelSpec, RunsOn, bundle_batch


def _from_checkpoint(path: Path) -> Any:
    from npu.models.adaface.checkpoint import from_pretrained

    return from_pretrained(path)


def _from_bundle(path: Path, device: Any) -> Any:
    from npu.models.adaface.npu import AdafaceBundle

    return AdafaceBundle.load(path, device)


MODEL = ModelSpec(
    name="adaface",
    kind="face",
    runtime="stages.models.adaface.runtime:AdaFaceRuntime",
    from_checkpoint=_from_checkpoint,
    from_bundle=_from_bundle,
    synthetic="npu.models.adaface.synthetic",
    # what a face gallery records (docs/face-id.md): the face_match stage compares the two
    model_id=lambda model, path: model.fingerprint(),
    export_batch=lambda model, bundle_dir: bundle_batch(bundle_dir),
    wire_meta=lambda: {
        "model": "adaface",
        "embedding_dim": 512,
        "embedding": "L2-normalised; compare faces by dot product",
    },
    npu2="npu.models.adaface.npu2",
    stands_in_for="ir101",
    runs_on=RunsOn("face", "interval"),
)
