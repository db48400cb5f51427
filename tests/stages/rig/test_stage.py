"""The rig3d stage end to end on synthetic scenes (stages/rig/stage.py), not the NPU: known
3D skeletons (rig_scenes.py) projected into 4 calibrated cameras ~3 m away with 1 px noise,
one view per keypoint occluded or moved, fed as the 2D PoseResults dark would send, with the
frames placed in the rig's groups as detect places them. Checked: the published 3D points
against the truth (the issue's 15 mm at 3 m), persistent rig person ids over a sequence, a
view dropped (frame or pose) degrading to the others, and the pose3d wire format.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from rig_scenes import corrupt, observe, people, ring_cameras

from pipeline.config import parse_config
from pipeline.graph import Context, check_stages
from pipeline.messages import now_ns
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue
from pipeline.wire import decode, encode_result
from stages.landmarks.result import LivePoseResult
from stages.models.sapiens2.result import PoseResult
from stages.rig.calibration import Calibration, write_calibration
from stages.rig.groups import RigRegistry
from stages.rig.pose3d import Pose3DResult
from stages.rig.stage import Rig3D

MS = 1_000_000
PERIOD_NS = 100 * MS  # a 10 fps rig
NAMES = ("cam0", "cam1", "cam2", "cam3")


class Sink:
    """An outbox that keeps what the stage sends."""

    def __init__(self) -> None:
        self.items: list = []

    async def send(self, item) -> None:
        self.items.append(item)


def rig_config(tmp_path, cams, detect=None, **options):
    write_calibration(
        tmp_path / "Calib.toml",
        Calibration({f"cam_{i + 1:02d}": c for i, c in enumerate(cams)}),
    )
    stage = {"kind": "rig3d", "rig": "hall", "cameras": list(NAMES)}
    stage |= {"calibration": "Calib.toml"} | options
    data = {
        "cameras": [
            {"name": n, "url": "synthetic:", "fps": 10.0, "staleness_ms": 5000.0} for n in NAMES
        ],
        "stages": [
            {"kind": "capture"},
            detect or {"kind": "detect", "person": "none", "face": "none"},
            stage,
        ],
    }
    return parse_config(data, tmp_path / "rig.toml")


def walk(seed: int, steps: int, n_people: int = 3):
    """Cameras and skeletons [T, P, 308, 3] m: people walking at ~0.5 m/s."""
    rng = np.random.default_rng(seed)
    cams = ring_cameras(rng)
    start = people(rng, n_people)
    velocity = rng.uniform(-0.5, 0.5, (n_people, 1, 3)) * [1, 1, 0]
    t = np.arange(steps)[:, None, None, None] * PERIOD_NS / 1e9
    return cams, start[None] + velocity[None] * t, rng


LIVE_DETECT = {"kind": "detect", "face": "none", "live": {"enabled": True}}


def play(
    tmp_path,
    seed=3,
    steps=10,
    drop_frame=(),
    drop_pose=(),
    decoys=False,
    shift=None,
    stages=None,
    **options,
):
    """Run the stage over a walk: frames placed as detect places them, the poses of each
    group fed in a random order. drop_frame: (step, camera) whose frame never reaches detect;
    drop_pose: (step, camera) whose frame is posed but whose poses never arrive. With
    poses = "live" the poses are detect's per-frame LivePoseResults; decoys: each pose also
    comes as the other kind, 200 px off (the rig must not use it); shift: {camera: (dx, dy)}
    px added to that camera's 2D; stages: a list the stage is appended to. Returns
    (truth [T, P, K, 3], the published results)."""
    cams, truth, rng = walk(seed, steps)
    live = options.get("poses") == "live"
    config = rig_config(tmp_path, cams, LIVE_DETECT if live else None, **options)
    (_, _, (cls, opts)) = check_stages(config)
    assert cls is Rig3D

    async def go():
        context = Context(config, Metrics())
        stage = Rig3D("rig3d", opts, context)
        if stages is not None:
            stages.append(stage)
        groups = RigRegistry.of(context).of_camera("cam0")
        inbox = BoundedQueue("rig3d", 10_000, "block", context.metrics)
        inbox.add_producer()
        sink = Sink()
        task = asyncio.create_task(stage.run(inbox, sink))
        base = now_ns()
        for step in range(steps):
            seen, _, _ = corrupt(observe(cams, truth[step], rng), rng)
            for name, by in (shift or {}).items():
                seen[NAMES.index(name), ..., :2] += by
            results = []
            for v, name in enumerate(NAMES):
                if (step, name) in drop_frame:
                    continue
                ts = base + step * PERIOD_NS + v * 3 * MS  # views 3 ms apart
                tag = groups.place(name, step, ts, ts + 5000 * MS, cams[v].size)
                assert tag is not None and tag.rig == "hall"
                order = rng.permutation(len(truth[step]))  # 2D track 10 v + true person
                groups.posed(name, step, [10 * v + int(p) for p in order])
                if (step, name) in drop_pose:
                    continue
                for p in order:
                    kinds = [live, not live] if decoys else [live]
                    for as_live in kinds:
                        keypoints = seen[v, p].astype(np.float32)
                        if as_live != live:
                            keypoints[:, :2] += 200.0
                        results.append(
                            (LivePoseResult if as_live else PoseResult)(
                                camera=name,
                                seq=step,
                                capture_ts_ns=ts,
                                deadline_ns=ts + 5000 * MS,
                                backend="sim",
                                model="test",
                                track_id=10 * v + int(p),
                                keypoints=keypoints,
                            )
                        )
            for i in rng.permutation(len(results)):
                await inbox.put(results[i])
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        inbox.producer_done()
        await task
        return sink.items

    return truth, asyncio.run(go())


def person_of(result: Pose3DResult) -> list[int]:
    """The true person of each published person, from its 2D tracks (10 v + p)."""
    out = []
    for tracks in result.tracks:
        truths = {t % 10 for t in tracks.values()}
        assert len(truths) == 1, tracks  # every view of a rig person is the same person
        out.append(truths.pop())
    return out


def errors_mm(truth: np.ndarray, result: Pose3DResult) -> np.ndarray:
    """Per triangulated keypoint, the distance to the truth in mm."""
    got = result.points[..., :3].astype(np.float64)
    true = truth[person_of(result)]
    d = np.linalg.norm(got - true, axis=-1) * 1000
    return d[np.isfinite(d)]


def test_published_points_are_within_15_mm_and_ids_persist(tmp_path):
    truth, results = play(tmp_path, steps=10)
    assert [r.seq for r in results] == list(range(10))
    ids_of: dict[int, set[int]] = {}
    for step, r in enumerate(results):
        assert isinstance(r, Pose3DResult) and r.topic == "pose3d/hall"
        assert r.points.shape == (3, 308, 4) and r.used.shape == (3, 308, 4)
        assert not r.missing and r.skew_ns == 9 * MS
        assert r.views == {n: step for n in NAMES}
        d = errors_mm(truth[step], r)
        assert len(d) > 0.95 * 3 * 308
        assert d.mean() <= 15.0, d.mean()
        conf = r.points[..., 3]
        assert (conf[np.isfinite(r.points[..., 0])] >= 0.6).all()
        for rid, p in zip(r.person_ids, person_of(r), strict=True):
            ids_of.setdefault(p, set()).add(rid)
    assert {p: len(ids) for p, ids in ids_of.items()} == {0: 1, 1: 1, 2: 1}
    assert len(set().union(*ids_of.values())) == 3


@pytest.mark.parametrize("poses", ["keyframes", "live"])
def test_a_rig_uses_the_poses_it_is_posed_by_and_ignores_the_other_kind(tmp_path, poses):
    # with "live", detect's per-frame poses triangulate every group and Sapiens2's (which
    # the same run also publishes) are ignored; with "keyframes", the other way round
    truth, results = play(tmp_path, steps=4, decoys=True, poses=poses)
    assert [r.seq for r in results] == list(range(4))
    for step, r in enumerate(results):
        d = errors_mm(truth[step], r)
        assert len(d) > 0.95 * 3 * 308 and d.mean() <= 15.0, d.mean()


def test_a_live_rig_needs_a_detect_stage_with_the_per_frame_pose(tmp_path):
    from pipeline.config import ConfigError

    cams, _, _ = walk(1, 1)
    config = rig_config(tmp_path, cams, poses="live")  # detect without `live`
    with pytest.raises(ConfigError, match=r"stages\[2\]\.poses: 'live' needs a detect stage"):
        check_stages(config)


def test_a_dropped_frame_degrades_the_group_to_the_other_views(tmp_path):
    truth, results = play(tmp_path, steps=6, drop_frame={(2, "cam2"), (3, "cam2")})
    assert len(results) == 6
    for step, r in enumerate(results):
        if step in (2, 3):
            assert r.missing == ("cam2",) and "cam2" not in r.views
            assert not r.used[..., 2].any()  # nothing from the missing camera
        else:
            assert not r.missing
        assert errors_mm(truth[step], r).mean() <= 15.0
    # the rig person ids stay through the degraded groups
    ids = [dict(zip(person_of(r), r.person_ids, strict=True)) for r in results]
    assert all(i == ids[0] for i in ids)


def test_a_pose_that_never_comes_is_waited_for_then_left_out(tmp_path):
    truth, results = play(tmp_path, steps=4, drop_pose={(1, "cam3")}, wait_ms=150.0)
    assert [r.seq for r in results] == [0, 1, 2, 3]
    late = results[1]
    assert not late.missing and late.views["cam3"] == 1  # the frame came, its poses did not
    assert not late.used[..., 3].any()
    assert errors_mm(truth[1], late).mean() <= 15.0


def test_the_filter_smooths_and_says_so(tmp_path):
    truth, raw = play(tmp_path, steps=8)
    _, smooth = play(tmp_path, steps=8, filter=True, filter_min_cutoff=1.0, filter_beta=0.0)
    assert all(r.filtered for r in smooth) and not any(r.filtered for r in raw)
    assert [sorted(person_of(r)) for r in smooth] == [[0, 1, 2]] * 8
    np.testing.assert_array_equal(smooth[0].points, raw[0].points)  # its first sample passes
    assert not np.array_equal(smooth[5].points, raw[5].points)


def test_fit_bones_fits_each_rig_persons_limbs_once_warm_and_counts_them(tmp_path):
    # three people, 11 instants: the first 10 (ConsistencyParams.warm) only gather lengths
    stages: list[Rig3D] = []
    truth, results = play(tmp_path, steps=11, stages=stages, consistency=True, fit_bones=True)
    _, plain = play(tmp_path, steps=11, consistency=True)
    assert stages[0].gauges()["bones_fitted"] == 1 * 3 * 12  # instants x people x limb joints
    for step, (r, p) in enumerate(zip(results, plain, strict=True)):
        assert errors_mm(truth[step], r).mean() <= 15.0
        assert np.array_equal(r.points, p.points, equal_nan=True) == (step < 10), step


def test_a_camera_whose_2d_sits_off_the_others_shows_its_offset_on_stats(tmp_path):
    """cam2's 2D moved 9 px right and 5 up, as a lens or pose that no longer fits the rig
    does: its recent residuals (projected - seen) lean the other way by several px, where an
    unshifted rig's offsets stay near 0. Triangulation spreads part of the shift over the
    other views, so their offsets grow too; the stats say a camera is off, not by how much."""
    stages: list[Rig3D] = []
    play(tmp_path, steps=2, stages=stages)  # unshifted: every offset near 0
    calm = stages[0].reconstructor.residuals.summary()
    assert set(calm) == set(NAMES)
    assert all(np.hypot(dx, dy) < 1.0 for _, dx, dy, _ in calm.values()), calm
    _, results = play(tmp_path, steps=6, shift={"cam2": (9.0, -5.0)}, stages=stages)
    assert len(results) == 6
    stage = stages[1]
    info = stage.metrics.info["rig3d"]
    recent = stage.reconstructor.residuals.summary()
    assert set(recent) == set(NAMES)
    for name, (median, dx, dy, n) in recent.items():
        assert n == 2000  # the window: 6 instants x 3 people x ~300 points used is more
        assert (
            f"median {median:.1f} px, offset {dx:+.1f}, {dy:+.1f} px over its last 2000 points"
            == info[f"reprojection_{name}"]
        )
    _, dx, dy, _ = recent["cam2"]
    shift = np.array([9.0, -5.0])
    assert np.hypot(dx, dy) > 3.0, (dx, dy)
    assert np.dot([dx, dy], shift) / np.hypot(dx, dy) / np.linalg.norm(shift) < -0.9, (dx, dy)
    gauges = stage.gauges()
    assert gauges["reprojection_offset_px_max"] == max(
        np.hypot(r[1], r[2]) for r in recent.values()
    )
    assert gauges["reprojection_offset_px_max"] > 3.0
    assert gauges["reprojection_px_max"] == max(r[0] for r in recent.values())


def test_the_wire_form_is_the_documented_one(tmp_path):
    _, results = play(tmp_path, steps=1)
    msg = decode(encode_result(results[0], now_ns()))
    h = msg.header
    assert msg.topic == "pose3d/hall" and h["kind"] == "pose3d" and h["camera"] == "hall"
    assert h["rig"] == "hall" and h["cameras"] == list(NAMES) and h["count"] == 3
    assert h["keypoints"] == 308 and len(h["person_ids"]) == 3 and len(h["tracks"]) == 3
    assert h["capture_ts_str"] == str(h["capture_ts"]) and h["skew_ms"] == 9.0
    assert [d["name"] for d in h["parts"]] == ["points", "error", "used"]
    assert msg.arrays["points"].shape == (3, 308, 4) and msg.arrays["points"].dtype == np.float32
    assert msg.arrays["error"].shape == (3, 308) and msg.arrays["used"].dtype == np.uint8


def test_a_group_before_any_pose_still_says_308_keypoints(tmp_path):
    # docs/protocol.md: a group with nobody seen has its message with count 0, and K is
    # meta.pose.count even before the stage has seen a pose.
    _, results = play(tmp_path, steps=2, drop_pose={(0, c) for c in NAMES}, wait_ms=150.0)
    h = decode(encode_result(results[0], now_ns())).header
    assert h["count"] == 0 and h["keypoints"] == 308
    assert results[1].points.shape == (3, 308, 4)


def test_trc_files_are_written_per_rig_person_at_shutdown(tmp_path):
    _, results = play(tmp_path, steps=3, trc="session.trc")
    files = sorted(p.name for p in tmp_path.glob("session_person*.trc"))
    assert files == [f"session_person{i}.trc" for i in sorted(results[0].person_ids)]
    lines = (tmp_path / files[0]).read_text().splitlines()
    assert lines[0].startswith("PathFileType\t4") and len(lines) == 5 + 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"calibration": "missing.toml"},
            r"stages\[2\]\.calibration: .*missing\.toml: cannot read",
        ),
        (
            {"cameras": ["cam0", "cam1", "cam9"]},
            r"stages\[2\]\.cameras\[2\]: no camera named 'cam9'",
        ),
        ({"wait_ms": 6000.0}, r"stages\[2\]\.wait_ms: .* not below"),
        ({"fit_bones": True}, r"stages\[2\]: `fit_bones` fits .* `consistency` keeps: set both"),
    ],
)
def test_validation_names_the_key_and_the_problem(tmp_path, change, message):
    from pipeline.config import ConfigError

    cams, _, _ = walk(1, 1)
    config = rig_config(tmp_path, cams, **change)
    with pytest.raises(ConfigError, match=message):
        check_stages(config)


def test_a_bad_calibration_names_the_file_and_table(tmp_path):
    from pipeline.config import ConfigError

    cams, _, _ = walk(1, 1)
    config = rig_config(tmp_path, cams)
    text = (tmp_path / "Calib.toml").read_text().replace("matrix = [ [ ", "matrix = [ [ -", 1)
    (tmp_path / "Calib.toml").write_text(text)
    with pytest.raises(ConfigError, match=r"calibration: .*Calib\.toml: \[cam_01\] matrix"):
        check_stages(config)


def test_a_camera_missing_from_the_calibration_is_named(tmp_path):
    from pipeline.config import ConfigError

    cams, _, _ = walk(1, 1)
    config = rig_config(tmp_path, cams[:3])
    with pytest.raises(ConfigError, match=r"cameras\[3\]: camera 'cam3' is not in the calibration"):
        check_stages(config)
