"""The `body/<rig>` result: one rig instant's fitted ANNY bodies (docs/body.md, "The
result"). A pipeline.messages.Result whose `camera` is the rig's name and whose `seq` is the
pose3d group's; published by the `body` stage (stages/body/stage.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Result


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
            "phenotype_labels": ["gender", "age", "muscle", "weight", "height", "proportions"],
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
