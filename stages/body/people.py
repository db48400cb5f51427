"""A rig's people as bodies: one BodyTracker per rig person id, fed each `pose3d/<rig>`
result, giving its `body/<rig>` result. A tracker whose person has not been seen for
max_age_groups pose3d groups is dropped (its phenotype with it).
"""

from __future__ import annotations

import numpy as np

from stages.body.fit import BodyFrame, BodyTracker, FitConfig
from stages.body.model import AnnyModel
from stages.body.result import BodyResult
from stages.rig.pose3d import Pose3DResult


class BodyPeople:
    def __init__(
        self, model: AnnyModel, config: FitConfig | None = None, max_age_groups: int = 30
    ) -> None:
        self.model = model
        self.config = config or FitConfig()
        self.max_age_groups = max_age_groups
        self.trackers: dict[int, BodyTracker] = {}
        self.last_seen: dict[int, int] = {}

    def fit(self, result: Pose3DResult) -> BodyResult:
        """The bodies of one pose3d result's people (its points [P, 308, 4])."""
        fitted: list[tuple[int, BodyFrame]] = []
        unfitted: list[int] = []
        for p, person in enumerate(result.person_ids):
            tracker = self.trackers.get(person)
            if tracker is None:
                tracker = self.trackers[person] = BodyTracker(self.model, self.config)
            self.last_seen[person] = result.seq
            points = np.asarray(result.points[p], dtype=np.float64)
            frame = tracker.update(points[:, :3], points[:, 3])
            if frame is None:
                unfitted.append(person)
            else:
                fitted.append((person, frame))
        for person in [
            i for i, s in self.last_seen.items() if result.seq - s > self.max_age_groups
        ]:
            del self.trackers[person], self.last_seen[person]
        names = self.trackers[fitted[0][0]].points.names if fitted else []
        return BodyResult(
            camera=result.camera,
            seq=result.seq,
            capture_ts_ns=result.capture_ts_ns,
            deadline_ns=result.deadline_ns,
            backend=result.backend,
            model=result.model,
            synthetic=result.synthetic,
            bones=tuple(self.model.bone_labels),
            keypoint_names=tuple(names),
            person_ids=tuple(person for person, _ in fitted),
            unfitted=tuple(unfitted),
            rotations=np.array([f.pose.rotations for _, f in fitted]).reshape(
                len(fitted), self.model.bone_count, 3, 3
            ),
            translation=np.array([f.pose.translation for _, f in fitted]).reshape(-1, 3),
            phenotype=np.array([f.phenotype for _, f in fitted]).reshape(-1, 6),
            phenotype_final=tuple(f.phenotype_final for _, f in fitted),
            keypoints=np.array([f.keypoints for _, f in fitted]).reshape(
                len(fitted), len(names), 3
            ),
            residuals=np.array([f.residuals for _, f in fitted]).reshape(len(fitted), len(names)),
        )
