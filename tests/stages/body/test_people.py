"""Bodies from pose3d results: one tracker per rig person, unfitted people named, trackers
dropped when their person is gone, and the body result on the wire."""

from __future__ import annotations

import numpy as np
from body_scenes import PHENOTYPE, observe, walk_and_wave

from pipeline.wire import decode, encode_result
from stages.body.fit import FitConfig
from stages.body.people import BodyPeople
from stages.rig.pose3d import Pose3DResult

FRAMES = 6


def _pose3d(seq: int, people: dict[int, tuple[np.ndarray, np.ndarray]]) -> Pose3DResult:
    points = np.zeros((len(people), 308, 4), np.float32)
    for p, (xyz, conf) in enumerate(people.values()):
        points[p, :, :3], points[p, :, 3] = xyz, conf
    return Pose3DResult(
        camera="hall",
        seq=seq,
        capture_ts_ns=1_000 * seq,
        deadline_ns=2_000 * seq,
        points=points,
        person_ids=tuple(people),
    )


def test_each_rig_person_gets_its_own_body_and_the_unfittable_are_named(body_model):
    seen = observe(body_model, PHENOTYPE, walk_and_wave(body_model, FRAMES), 1.0, seed=1)
    bodies = BodyPeople(body_model, FitConfig(window=4), max_age_groups=2)
    empty = (np.full((308, 3), np.nan), np.zeros(308))
    results = []
    for f in range(FRAMES):
        people = {7: (seen.points308[f], seen.confidence308[f])}
        if f == 1:
            people[9] = empty
        results.append(bodies.fit(_pose3d(f, people)))
    assert [r.person_ids for r in results] == [(7,)] * FRAMES
    assert [r.unfitted for r in results] == [(), (9,), (), (), (), ()]
    assert [r.phenotype_final for r in results] == [(False,)] * 3 + [(True,)] * 3
    # person 9, last seen in group 1, is dropped after 2 more groups
    assert sorted(bodies.trackers) == [7]
    last = results[-1]
    error = np.linalg.norm(last.keypoints[0] - seen.truth[-1], axis=-1)
    assert np.median(error) < 0.01
    message = decode(encode_result(last, publish_ts_ns=5))
    assert message.topic == "body/hall"
    assert message.header["person_ids"] == [7] and message.header["bones"][0] == "root"
    assert message.arrays["rotations"].shape == (1, body_model.bone_count, 3, 3)
    assert message.arrays["keypoints"].shape == (1, len(last.keypoint_names), 3)
    np.testing.assert_allclose(message.arrays["residuals"], last.residuals.astype(np.float32))
