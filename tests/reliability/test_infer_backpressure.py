"""`block` all the way through the NPU stage: an offline run whose every inbox is `block`
loses no face job. stages/infer.py's feeder holds a job while its model's `block` queue
(the default when the stage's inbox is `block`) is full, so the inbox fills and back-pressure
reaches capture. Before that the feeder took every job at once and the per-model queue
(queue_size 2, drop_oldest) dropped what did not fit (`queue_full` under infer/adaface).
Paced at NPU2 time (0.5 s a face), so the device is slower than the producers.

Issue 33: a face or CLIP job of a tracked person still replaced its track's queued one (the
scheduler's key: the latest crop wins), counted `queue_full` + `replaced`: with every inbox
`block`, 64 of 73 face and 92 of 108 CLIP jobs of two files were dropped. Under a `block`
queue a job now supersedes nothing.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

from engine_stages import start

FAULT_STAGES = str(Path(__file__).parent)
FRAMES = 16


def test_a_block_pipeline_through_infer_loses_no_face_job(
    write_config, make_clip, tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "path", [FAULT_STAGES, *sys.path])
    clip = make_clip("faces.avi", frames=FRAMES)
    path = write_config(
        f"""
        [pipeline]
        drain_timeout_s = 60.0
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "cam"
        url = "{clip}"
        realtime = false
        staleness_ms = 600000
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "faces"
        kind = "fault_stages:FaceJobs"
        inbox = {{ size = 4, policy = "block" }}
        [[stages]]
        name = "infer"
        kind = "infer"
        backend = "sim"
        synthetic_cache = "{tmp_path / "synthetic"}"
        inbox = {{ size = 4, policy = "block" }}
        adaface = {{ enabled = true, synthetic = true, queue_size = 2 }}
        [stages.sim]
        registry_dir = "{tmp_path / "hwctx"}"
        [[stages]]
        name = "sink"
        kind = "fault_stages:Timed"
        inbox = {{ size = 4, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(path)
        assert await asyncio.wait_for(task, 120) == 0
        return pipeline.stages["sink"].items, pipeline.metrics

    items, metrics = asyncio.run(main())
    print(f"\nface results {len(items)} of {FRAMES}; drops {metrics.snapshot()['stages']}")
    assert metrics.dropped() == 0
    assert len(items) == FRAMES


def test_a_block_pipeline_keeps_every_face_and_clip_job_of_one_track(
    write_config, make_clip, tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "path", [FAULT_STAGES, *sys.path])
    frames = 8
    clip = make_clip("faces.avi", frames=frames)
    path = write_config(
        f"""
        [pipeline]
        drain_timeout_s = 60.0
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "cam"
        url = "{clip}"
        realtime = false
        staleness_ms = 600000
        [[stages]]
        kind = "capture"
        [[stages]]
        name = "jobs"
        kind = "fault_stages:TrackedJobs"
        inbox = {{ size = 4, policy = "block" }}
        [[stages]]
        name = "infer"
        kind = "infer"
        backend = "sim"
        synthetic_cache = "{tmp_path / "synthetic"}"
        inbox = {{ size = 4, policy = "block" }}
        adaface = {{ enabled = true, synthetic = true, queue_size = 2 }}
        clip = {{ enabled = true, synthetic = true, queue_size = 2, labels = ["a", "b"] }}
        [stages.sim]
        registry_dir = "{tmp_path / "hwctx"}"
        [[stages]]
        name = "sink"
        kind = "fault_stages:Timed"
        inbox = {{ size = 4, policy = "block" }}
        """
    )

    async def main():
        pipeline, task = await start(path)
        assert await asyncio.wait_for(task, 180) == 0
        return pipeline.stages["sink"].items, pipeline.metrics

    items, metrics = asyncio.run(main())
    kinds = Counter(type(item).__name__ for _, item in items)
    print(f"\nresults {dict(kinds)} of {frames} frames; drops {metrics.snapshot()['stages']}")
    assert metrics.dropped() == 0
    assert kinds == {"FaceInferred": frames, "ClipInferred": frames}
