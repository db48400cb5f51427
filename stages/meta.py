"""The `meta` topic: what a subscriber in any language needs to label and draw the results.

The 308 Sapiens2 keypoint names, their groups and group colours, the skeleton edges, and the
facts of each model's published arrays, all from npu/models/keypoints308.py; docs/meta.json
is the same data as a file (`python -m stages.meta > docs/meta.json` writes it). The publish
stage sends it, with the run's cameras and models, to every new subscriber (docs/protocol.md).
"""

from __future__ import annotations

import json
import sys

from npu.models import keypoints308
from pipeline.config import Config

META_VERSION = 1

# One colour per keypoint group (#rrggbb): points take their group's colour, and an edge the
# group it lies in (an edge between body and hands or feet is drawn in the limb's colour).
GROUP_COLOURS: dict[str, str] = {
    "body": "#00e676",
    "feet": "#ff9100",
    "hands": "#2979ff",
    "face": "#ff4081",
}

FACE_LANDMARKS: dict[str, list[str]] = {
    "yunet": ["image-left eye", "image-right eye", "nose", "image-left mouth corner",
              "image-right mouth corner"],
    "sapiens2": ["image-left eye", "image-right eye", "nose", "image-left mouth corner",
                 "image-right mouth corner"],
    "blazeface": ["image-left eye", "image-right eye", "nose", "mouth centre"],
}  # fmt: skip


def _group_of() -> list[str]:
    group_of = [""] * len(keypoints308.NAMES)
    for group, indices in keypoints308.GROUPS.items():
        for i in indices:
            group_of[i] = group
    return group_of


def _edge_group(group_of: list[str], a: int, b: int) -> str:
    """The group an edge is drawn in: its points' own, or the limb's when one is body."""
    ga, gb = group_of[a], group_of[b]
    if ga == gb:
        return ga
    return gb if ga == "body" else ga


def contract() -> dict:
    """The static meta content (docs/meta.json): keypoints, groups, skeleton, model facts."""
    group_of = _group_of()
    return {
        "meta_version": META_VERSION,
        "pose": {
            "model": "sapiens2",
            "keypoint_set": "sapiens2-308",
            "count": len(keypoints308.NAMES),
            "columns": ["x", "y", "score"],
            "names": list(keypoints308.NAMES),
            "group_of": group_of,
            "groups": [
                {"name": g, "color": GROUP_COLOURS[g], "count": len(keypoints308.GROUPS[g])}
                for g in keypoints308.GROUPS
            ],
            "skeleton": [[a, b, _edge_group(group_of, a, b)] for a, b in keypoints308.SKELETON],
        },
        "face": {
            "model": "adaface",
            "embedding_dim": 512,
            "embedding": "L2-normalised; compare faces by dot product",
            "landmarks": FACE_LANDMARKS,
        },
        "clip": {"probabilities": "softmax over the labels of the message, in their order"},
    }


def run_meta(config: Config) -> dict:
    """contract() plus this run's cameras and, per infer stage, its backend and models."""
    infer = []
    for name, stage in zip(config.stage_names, config.stages, strict=True):
        if stage.kind != "infer":
            continue
        opts = stage.options
        models = [
            m
            for m in ("sapiens2", "adaface", "clip")
            if isinstance(opts.get(m), dict) and opts[m].get("enabled", False)
        ]
        infer.append({"stage": name, "backend": opts.get("backend"), "models": models})
    return {**contract(), "cameras": [c.name for c in config.cameras], "infer": infer}


def main() -> int:
    json.dump(contract(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
