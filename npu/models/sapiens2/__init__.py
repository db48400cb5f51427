"""Sapiens2-Pose 0.4b / 1b: a person box -> 308 whole-body keypoints.

Laid out as taconite-sapiens2: config (sizes), preprocess (box -> crop), model (the
forward), checkpoint (HF weights, cpu backend), npu (the bundle replay), export (sim
bundles), post (heatmaps -> keypoints, DARK), check (bundle self-check), synthetic, keypoints
(the 308-keypoint metadata). `MODEL` is its registry entry (npu.models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu.models import ModelSpec, RunsOn, bundle_batch


def _from_checkpoint(path: Path) -> Any:
    from npu.models.sapiens2.checkpoint import from_pretrained

    return from_pretrained(path)


def _from_bundle(path: Path, device: Any) -> Any:
    from npu.models.sapiens2.npu import from_bundle

    return from_bundle(path, device)


def _wire_meta() -> dict:
    from npu.models.sapiens2.keypoints import wire_meta

    return wire_meta()


MODEL = ModelSpec(
    name="sapiens2",
    kind="pose",
    runtime="stages.models.sapiens2.runtime:Sapiens2Runtime",
    from_checkpoint=_from_checkpoint,
    from_bundle=_from_bundle,
    synthetic="npu.models.sapiens2.synthetic",
    export_batch=lambda model, bundle_dir: bundle_batch(bundle_dir),
    wire_meta=_wire_meta,
    npu2="npu.models.sapiens2.npu2",
    stands_in_for="0.4b",
    runs_on=RunsOn("person", "refresh", max_per_frame=1),
)
