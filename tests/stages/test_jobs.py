"""How the graph carries the infer stage's Inferred items (stages/jobs.py): an inbox reads their
job's frame identity (stale drops under its camera), and each model's Inferred subclass reaches
only its own post stage."""

from __future__ import annotations

import asyncio

import numpy as np

from pipeline.graph import Outbox
from pipeline.messages import now_ns
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue
from stages.models.adaface.job import FaceInferred
from stages.models.adaface.post import FaceMatch
from stages.models.clip.job import ClipInferred
from stages.models.clip.post import ClipLabels
from stages.models.sapiens2.job import PoseInferred
from stages.models.sapiens2.post import Dark
from tests.stages.models.inferred_items import clip_item, face_item, pose_item


def test_a_stale_inferred_is_dropped_stale_under_its_camera_by_the_inbox():
    async def main():
        m = Metrics()
        q = BoundedQueue("dark", 4, "drop_oldest", m)
        item = pose_item(np.zeros((17, 8, 6), np.float32), [20, 30, 40, 60])
        fresh = pose_item(np.zeros((17, 8, 6), np.float32), [20, 30, 40, 60], track_id=5)
        item.job.deadline_ns = now_ns() - 1
        await q.put(item)
        await q.put(fresh)
        q.close()
        return m, [x async for x in q]

    m, got = asyncio.run(main())
    assert [x.job.track_id for x in got] == [5]
    assert m.dropped("dark", "cam", "stale") == 1
    assert m.dropped("dark", "", "stale") == 0


def test_each_inferred_kind_reaches_exactly_its_own_postprocess_inbox():
    async def main():
        m = Metrics()
        stages = {"dark": Dark, "face_match": FaceMatch, "clip_labels": ClipLabels}
        queues = {name: BoundedQueue(name, 8, "drop_oldest", m) for name in stages}
        out = Outbox("infer", [(n, cls.accepts, queues[n]) for n, cls in stages.items()], m)
        text = np.eye(3, 16, dtype=np.float32)
        await out.send(pose_item(np.zeros((17, 8, 6), np.float32), [20, 30, 40, 60]))
        await out.send(face_item(np.ones(16, np.float32)))
        await out.send(clip_item(text[0], text, ["a", "b", "c"]))
        got = {}
        for name, q in queues.items():
            q.close()
            got[name] = [type(x) async for x in q]
        return got

    got = asyncio.run(main())
    assert got == {
        "dark": [PoseInferred],
        "face_match": [FaceInferred],
        "clip_labels": [ClipInferred],
    }
