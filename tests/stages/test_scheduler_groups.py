"""Grouped jobs in the batching scheduler (stages/scheduler.py, QueuedJob.group): a rig's pose
jobs of one instant share one priority and run back to back, on a simulated, overloaded
device, while per-camera fairness and staleness hold."""

from __future__ import annotations

from collections import Counter, defaultdict

from stages.batches import ModelProfile, QueuedJob
from stages.planning.simulate import SimClock, simulate
from stages.scheduler import BatchScheduler

MS = 1_000_000
S = 1_000 * MS
COST_S = 0.010  # one pose pass
RIG = ("r0", "r1", "r2", "r3")  # 10 fps, 2 people each, views 0-9 ms apart
OTHERS = ("n0", "n1")  # 30 fps, one pose job a frame
STALENESS_NS = 500 * MS


def run(grouped: bool, seconds: int = 20):
    """The rig's 80 jobs/s and the other cameras' 60 jobs/s on a device that does 100 a
    second. Returns (report, scheduler)."""
    clock = SimClock()
    sched = BatchScheduler(
        [ModelProfile("pose", 1, 0.0, ("pose/0",), COST_S, queue_size=64)],
        clock=clock,
        prepare_ahead_s=0.005,
    )
    events = []
    posed: dict[tuple[str, int], int] = {}  # (camera, track) -> capture time of its last pose

    def submit(camera: str, track: int, ts: int, group):
        def go() -> None:
            sched.submit(
                QueuedJob(
                    model="pose",
                    camera=camera,
                    payload=(camera, track, ts, group),
                    deadline_ns=ts + STALENESS_NS,
                    # Sapiens2Runtime.priority: the oldest pose first, never-posed first
                    priority=posed.get((camera, track), -1),
                    key=(camera, track),
                    capture_ts_ns=ts,
                    group=group if grouped else None,
                )
            )

        return go

    for k in range(10 * seconds):
        for v, camera in enumerate(RIG):
            ts = k * 100 * MS + 3 * v * MS
            # one person stays; the other is new in every group (a new track, never posed)
            for track in (0, 1000 + k):
                events.append((ts + 2 * MS, submit(camera, track, ts, ("rig", k))))
    for k in range(30 * seconds):
        for camera in OTHERS:
            ts = k * S // 30
            events.append((ts + 1 * MS, submit(camera, 0, ts, None)))

    def done(batch, returned) -> None:
        for job, _ in returned:
            camera, track, ts, _ = job.payload
            posed[camera, track] = max(posed.get((camera, track), -1), ts)

    report = simulate(
        sched, clock, events, lambda b: COST_S, until_ns=seconds * S, on_complete=done
    )
    return report, sched


def group_spans(report) -> dict:
    """Rig group -> (jobs done, first start, last end) over the batches that ran its jobs."""
    spans = defaultdict(lambda: [0, None, None])
    for start, end, batch in report.batches:
        camera, _, _, group = batch.jobs[0].payload
        if camera in RIG:
            s = spans[group]
            s[0] += 1
            s[1] = start if s[1] is None else min(s[1], start)
            s[2] = end if s[2] is None else max(s[2], end)
    return spans


def test_a_rig_groups_views_are_posed_within_one_group_window_under_load():
    report, _ = run(grouped=True)
    spans = group_spans(report)
    assert len(spans) == 200  # every group got some of its views posed
    # the rig asks 20 passes/s per camera, over its cameras' fair sixth of the device, so
    # about a third of the groups get all 8 views; each view posed went within the window
    assert sum(s[0] == 8 for s in spans.values()) >= 60
    window_ns = 100 * MS  # one group period of the 10 fps rig
    assert all(end - start <= window_ns for _, start, end in spans.values())


def other_passes_inside_groups(report) -> int:
    """Passes of the other cameras that ran between a rig group's first and last pass."""
    spans = group_spans(report).values()
    return sum(
        any(s[1] < start < s[2] for s in spans)
        for start, _, batch in report.batches
        if batch.jobs[0].payload[0] in OTHERS
    )


def test_a_started_group_runs_back_to_back_where_fairness_allows():
    grouped = other_passes_inside_groups(run(grouped=True)[0])
    plain = other_passes_inside_groups(run(grouped=False)[0])
    # measured: 203 with groups, 398 without (the simulation is deterministic)
    assert grouped < 0.6 * plain, (grouped, plain)


def test_groups_keep_per_camera_fairness_and_staleness():
    for grouped in (True, False):
        report, sched = run(grouped=grouped)
        done = Counter(job.camera for _, job, _ in report.results)
        # every camera has more work than a sixth of the device: each gets about a sixth
        share = sum(done.values()) / 6
        for camera in RIG + OTHERS:
            assert abs(done[camera] - share) <= 0.1 * share, (grouped, dict(done))
        for t, job, _ in report.results:
            assert t <= job.deadline_ns  # nothing published past its deadline
        assert sched.stats.drops  # overloaded: supersession and npu_busy drops happen


def test_a_groups_jobs_share_the_lowest_priority():
    clock = SimClock()
    sched = BatchScheduler([ModelProfile("pose", 1, 0.0, (), COST_S)], clock=clock)
    jobs = [
        QueuedJob("pose", cam, cam, deadline_ns=S, priority=p, group=g)
        for cam, p, g in (("a", 50, "g1"), ("b", 20, "g1"), ("c", 30, None), ("d", 70, "g1"))
    ]
    for job in jobs:
        sched.submit(job)
    assert [j.priority for j in jobs] == [20, 20, 30, 20]
