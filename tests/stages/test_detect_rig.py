"""The detect stage for the cameras of a rig (stages/detect.py with stages/rig/groups.py):
every frame is placed in its rig's group by capture time; only the frames of posed groups
get pose jobs, one per tracked person (the largest boxes first, up to max_people), all
tagged with the group; a camera outside the rig keeps its per-frame pose budget."""

from __future__ import annotations

import numpy as np

from pipeline.config import parse_config
from pipeline.graph import Context
from pipeline.messages import Frame, now_ns
from pipeline.metrics import Metrics
from stages.detect import Detect, DetectOptions
from stages.models.sapiens2.job import PoseJob
from stages.rig.groups import RigGroups, RigRegistry, RigTag

MS = 1_000_000
# three person boxes: widths 30, 50, 40 px
REGIONS = [
    {"name": "small", "x": 10, "y": 10, "w": 30, "h": 100},
    {"name": "large", "x": 60, "y": 10, "w": 50, "h": 100},
    {"name": "medium", "x": 130, "y": 10, "w": 40, "h": 100},
]


def test_only_posed_groups_get_pose_jobs_for_their_largest_people_tagged_by_group(tmp_path):
    config = parse_config(
        {
            "cameras": [{"name": c, "url": "synthetic:"} for c in ("a", "b", "c")],
            "stages": [{"kind": "capture"}],
        },
        tmp_path / "run.toml",
    )
    context = Context(config, Metrics())
    rig = RigGroups("r", {"a": 10.0, "b": 10.0}, pose_interval_ns=250 * MS, max_people=2)
    RigRegistry.of(context).add(rig)
    stage = Detect(
        "detect",
        DetectOptions(person="roi", person_regions=REGIONS, face="none", pose_jobs_per_frame=1),
        context,
    )
    image = np.zeros((120, 200, 3), np.uint8)
    t0 = now_ns()
    jobs: dict[tuple[str, int], list[PoseJob]] = {}
    for seq in range(7):
        for offset, camera in enumerate(("a", "b", "c")):
            ts = t0 + seq * 100 * MS + 5 * offset * MS
            items = stage.process(Frame(camera, seq, ts, ts + 10**10, image))
            jobs[camera, seq] = [i for i in items if isinstance(i, PoseJob)]
    # posed groups: capture 0, 300, 600 ms (at least 250 ms apart)
    for seq in range(7):
        for camera in ("a", "b"):
            got = jobs[camera, seq]
            if seq % 3:
                assert got == [], (camera, seq)
                continue
            widths = [round(float(j.box_xywh[2])) for j in got]
            assert widths == [50, 40]  # the two largest of three
            assert {j.group for j in got} == {RigTag("r", seq)}
    # the camera outside the rig: one pose job a frame (its tracks' oldest poses first)
    assert all(len(jobs["c", seq]) == 1 and jobs["c", seq][0].group is None for seq in range(3))
    plans = {p.id: p for p in rig.posed_groups()}
    assert sorted(plans) == [0, 3, 6]
    for gid, plan in plans.items():
        assert set(plan.views) == {"a", "b"} and plan.views["a"][0] == gid
        assert plan.jobs == {c: tuple(j.track_id for j in jobs[c, gid]) for c in ("a", "b")}
    assert plans[0].closed and plans[0].expected() == {
        (c, j.track_id) for c in ("a", "b") for j in jobs[c, 0]
    }
