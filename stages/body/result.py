"""The `body/<rig>` result: one rig instant's fitted ANNY bodies (docs/body.md, "The
result"). A pipeline.messages.Result whose `camera` is the rig's name and whose `seq` is the
pose3d group's; published by the `body` stage (stages/body/stage.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Result
from stages.body import skeleton
from stages.body.anny_data import PHENOTYPES
from stages.body.fit import FINGER_BONES, FITTED_BONES
from stages.body.keypoint_map import FINGER_JOINTS_TO_ANNY, SAPIENS_TO_ANNY
from stages.body.mesh_topic import VERTEX_COUNT

# The `meta` message's `body` entry (stages/meta.py; docs/protocol.md, "body"): how to read
# a body message's parts without loading the model.
WIRE_META = {
    "model": "anny-0.6.2",
    "bones": list(skeleton.NAMES),
    "parents": list(skeleton.PARENTS),
    "fitted_bones": ["root", *FITTED_BONES],
    "keypoints": [name for name, _, _ in SAPIENS_TO_ANNY],
    # with the stage's `fingers`: these bones turn too, and these points follow `keypoints`
    "finger_bones": list(FINGER_BONES),
    "finger_keypoints": [name for name, _, _ in FINGER_JOINTS_TO_ANNY],
    "keypoints_from": "pose",
    "phenotype_labels": list(PHENOTYPES),
    "rotations": "local-ref",
    "units": "m",
    "parts": [
        {"name": "rotations", "dtype": "float32", "shape": ["P", "B", 3, 3]},
        {"name": "translation", "dtype": "float32", "shape": ["P", 3], "units": "m"},
        {"name": "phenotype", "dtype": "float32", "shape": ["P", 6]},
        {"name": "keypoints", "dtype": "float32", "shape": ["P", "N", 3], "units": "m"},
        {"name": "residuals", "dtype": "float32", "shape": ["P", "N"], "units": "m"},
    ],
    "mesh": {
        "topic": "mesh/<rig>",
        "vertex_count": VERTEX_COUNT,
        "parts": [
            {"name": "vertices", "dtype": "float32", "shape": ["P", "V", 3], "units": "m"},
            {"name": "triangles", "dtype": "int32", "shape": ["T", 3], "when": "has_triangles"},
        ],
    },
}


def _empty(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


@dataclass(slots=True, kw_only=True)
class BodyResult(Result):
    """Per fitted person p: rotations float32 [P, B, 3, 3], each bone's pose delta in anny's
    "local-ref" axes (bone order: `bones`); translation [P, 3] the root's world position (m);
    phenotype [P, 6] (gender, age, muscle, weight, height, proportions) and phenotype_final
    (held, or still fitted over the window); keypoints [P, N, 3] the fitted mapped points (m,
    order: `keypoints`, Sapiens2 names) and residuals [P, N] their distance to the
    triangulated ones (m, NaN without a target). person_ids: rig person ids; unfitted: the
    ids of people in the pose3d result that had too few keypoints to fit."""

    kind: str = "body"
    bones: tuple[str, ...] = ()
    keypoint_names: tuple[str, ...] = ()
    person_ids: tuple[int, ...] = ()
    unfitted: tuple[int, ...] = ()
    rotations: np.ndarray = field(default_factory=lambda: _empty(0, 0, 3, 3))
    translation: np.ndarray = field(default_factory=lambda: _empty(0, 3))
    phenotype: np.ndarray = field(default_factory=lambda: _empty(0, 6))
    phenotype_final: tuple[bool, ...] = ()
    keypoints: np.ndarray = field(default_factory=lambda: _empty(0, 0, 3))
    residuals: np.ndarray = field(default_factory=lambda: _empty(0, 0))

    def header_fields(self) -> dict:
        return {
            **self.extra,
            "rig": self.camera,
            "count": len(self.person_ids),
            "person_ids": [int(i) for i in self.person_ids],
            "unfitted": [int(i) for i in self.unfitted],
            "bones": list(self.bones),
            "keypoints": list(self.keypoint_names),
            "phenotype_labels": list(PHENOTYPES),
            "phenotype_final": [bool(x) for x in self.phenotype_final],
            "units": "m",
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        p, b, n = len(self.person_ids), len(self.bones), len(self.keypoint_names)
        return [
            ("rotations", np.asarray(self.rotations, np.float32).reshape(p, b, 3, 3)),
            ("translation", np.asarray(self.translation, np.float32).reshape(p, 3)),
            ("phenotype", np.asarray(self.phenotype, np.float32).reshape(p, 6)),
            ("keypoints", np.asarray(self.keypoints, np.float32).reshape(p, n, 3)),
            ("residuals", np.asarray(self.residuals, np.float32).reshape(p, n)),
        ]
