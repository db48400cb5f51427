"""The `meta` topic: what a subscriber in any language needs to label and draw the results.

Each registered model's facts (ModelSpec.wire_meta: Sapiens2's 308 keypoint names, groups,
group colours and skeleton edges from npu/models/sapiens2/keypoints.py; AdaFace's embedding;
CLIP's probabilities), the face landmark orders and how to read pose3d and body (the ANNY
bones and their parents, the fitted keypoints' names); docs/meta.json is the
same data as a file (`python -m stages.meta > docs/meta.json` writes it). The publish stage
sends it, with the run's cameras, models and rigs, to every new subscriber (docs/protocol.md).
"""

from __future__ import annotations

import json
import sys

from npu import models
from pipeline.config import Config
from stages.body.result import WIRE_META as BODY_META
from stages.landmarks.result import WIRE_META as LIVE_POSE_META
from stages.rig.pose3d import WIRE_META as POSE3D_META

META_VERSION = 1

FACE_LANDMARKS: dict[str, list[str]] = {
    "yunet": ["image-left eye", "image-right eye", "nose", "image-left mouth corner",
              "image-right mouth corner"],
    "sapiens2": ["image-left eye", "image-right eye", "nose", "image-left mouth corner",
                 "image-right mouth corner"],
    "blazeface": ["image-left eye", "image-right eye", "nose", "mouth centre"],
}  # fmt: skip


def contract() -> dict:
    """The static meta content (docs/meta.json): each registered model's facts under its
    result kind (ModelSpec.wire_meta), with the face landmark orders of every landmark source."""
    out: dict = {"meta_version": META_VERSION}
    for name in models.names():
        spec = models.spec(name)
        if spec.wire_meta is not None:
            out[spec.kind] = spec.wire_meta()
    if "face" in out:
        out["face"]["landmarks"] = FACE_LANDMARKS
    if "pose" in out:
        out["pose"]["live"] = LIVE_POSE_META
    out["pose3d"] = dict(POSE3D_META)
    out["body"] = dict(BODY_META)
    return out


def run_meta(config: Config) -> dict:
    """contract() plus this run's cameras, per infer stage its backend and models, and per
    rig3d stage its rig and the rig's cameras (the columns of a pose3d message's `used`)."""
    infer = []
    for name, stage in zip(config.stage_names, config.stages, strict=True):
        if stage.kind != "infer":
            continue
        opts = stage.options
        enabled = [
            m
            for m in models.names()
            if isinstance(opts.get(m), dict) and opts[m].get("enabled", False)
        ]
        infer.append({"stage": name, "backend": opts.get("backend"), "models": enabled})
    rigs = [
        {"rig": s.options.get("rig"), "cameras": list(s.options.get("cameras", [])), "stage": n}
        for n, s in zip(config.stage_names, config.stages, strict=True)
        if s.kind == "rig3d"
    ]
    return {
        **contract(),
        "cameras": [c.name for c in config.cameras],
        "infer": infer,
        "rigs": rigs,
    }


def main() -> int:
    json.dump(contract(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
