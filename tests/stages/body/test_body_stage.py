"""The body stage between queues: its rig's pose3d results in, body results out in order,
other rigs' ignored, a result it cannot fit counted as an error drop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from body_scenes import PHENOTYPE, observe, walk_and_wave
from stage_items import pose3d, run_context, run_groups
from vmc_receiver import Receiver

from pipeline.config import ConfigError, parse_config
from pipeline.graph import Outbox, check_stages, stage_kinds
from pipeline.messages import Result
from pipeline.queues import BoundedQueue
from stages.body.exports.vmc import HUMANOID
from stages.body.result import BodyResult
from stages.body.stage import Body, BodyOptions
from stages.rig.calibration import Calibration, Camera, write_calibration


def run_body(options: BodyOptions, context, points: np.ndarray) -> tuple[list, Body]:
    """A body stage fed one pose3d message of rig "hall" per frame of points [F, P, K, 4]
    until its inbox closes: (its F published results, the stage)."""
    return run_groups(
        options, context, [pose3d("hall", f, points[f : f + 1]) for f in range(len(points))]
    )


def test_the_rigs_pose3d_results_become_body_results_in_order(body_model, tmp_path):
    seen = observe(body_model, PHENOTYPE, walk_and_wave(body_model, 3), 1.0, seed=2)
    points = np.concatenate([seen.points308, seen.confidence308[..., None]], axis=-1)
    items = [
        pose3d("hall", 0, points[0:1]),
        pose3d("yard", 1, points[1:2]),
        pose3d("hall", 2, np.zeros((1, 17, 4))),  # not 308 keypoints: cannot be fitted
        pose3d("hall", 3, points[1:2]),
        pose3d("hall", 4, points[2:3]),
    ]

    async def run() -> list:
        context = run_context(tmp_path)
        metrics = context.metrics
        stage = Body("body", BodyOptions(rig="hall", window=2), context)
        inbox = BoundedQueue("body", 8, "block", metrics)
        published = BoundedQueue("publish", 8, "block", metrics)
        out = Outbox("body", [("publish", (Result,), published)], metrics)
        for item in items:
            await inbox.put(item)
        inbox.close()
        await stage.run(inbox, out)
        got = []
        while len(published):
            got.append(await published.get())
        return got, metrics.dropped("body", "hall", "error")

    got, errors = asyncio.run(run())
    assert [type(r) for r in got] == [BodyResult] * 3
    assert [(r.topic, r.seq, r.person_ids) for r in got] == [
        ("body/hall", 0, (3,)),
        ("body/hall", 3, (3,)),
        ("body/hall", 4, (3,)),
    ]
    assert errors == 1
    assert [r.phenotype_final for r in got] == [(False,), (True,), (True,)]
    assert stage_kinds()["body"] == "stages.body.stage:Body"


def _config(tmp_path, body: dict):
    names = ["cam0", "cam1"]
    write_calibration(
        tmp_path / "Calib.toml",
        Calibration({f"cam_{i + 1:02d}": c for i, c in enumerate(_cameras(names))}),
    )
    data = {
        "cameras": [{"name": n, "url": "synthetic:", "fps": 10.0} for n in names],
        "stages": [
            {"kind": "capture"},
            {"kind": "detect", "person": "none", "face": "none"},
            {"kind": "rig3d", "rig": "hall", "cameras": names, "calibration": "Calib.toml"},
            {"kind": "body"} | body,
        ],
    }
    return parse_config(data, tmp_path / "rig.toml")


def _cameras(names):
    return [
        Camera(n, (640, 480), [[500, 0, 320], [0, 500, 240], [0, 0, 1]], [0] * 4, [0, 0, 0], t)
        for n, t in zip(names, ([0, 0, 3], [1, 0, 3]), strict=True)
    ]


def test_a_config_with_a_body_stage_after_rig3d_validates(tmp_path):
    checked = check_stages(_config(tmp_path, {"rig": "hall", "window": 45}))
    cls, options = checked[-1]
    assert cls is Body and options == BodyOptions(rig="hall", window=45)
    with pytest.raises(ConfigError, match=r"stages\[3\]\.window"):
        check_stages(_config(tmp_path, {"rig": "hall", "window": 0}))


def test_trc_files_of_the_fitted_keypoints_are_written_per_person_at_shutdown(body_model, tmp_path):
    seen = observe(body_model, PHENOTYPE, walk_and_wave(body_model, 3), 1.0, seed=2)
    points = np.concatenate([seen.points308, seen.confidence308[..., None]], axis=-1)
    context = run_context(tmp_path)
    options = BodyOptions(rig="hall", window=2, trc="out/walk.trc", trc_max_frames=2)
    (tmp_path / "out").mkdir()

    got, _ = run_body(options, context, points)
    lines = (tmp_path / "out" / "walk_person3.trc").read_text().splitlines()
    names = lines[3].split("\t")[2::3]
    assert names == list(got[0].keypoint_names)
    rows = lines[5:]
    assert len(rows) == 2  # trc_max_frames
    first = np.array(rows[0].split("\t")[2:], dtype=float).reshape(-1, 3)
    # Y up as OpenSim reads it: (y, z, x) of the Z-up world, to the file's 6 decimals
    np.testing.assert_allclose(first, got[0].keypoints[0][:, [1, 2, 0]], atol=1e-6)


def test_the_stage_writes_the_mot_bvh_and_glb_files_and_sends_vmc(body_model, tmp_path):
    seen = observe(body_model, PHENOTYPE, walk_and_wave(body_model, 3), 1.0, seed=2)
    points = np.concatenate([seen.points308, seen.confidence308[..., None]], axis=-1)
    receiver = Receiver()
    options = BodyOptions(
        rig="hall", window=2, mot="out/walk", bvh="out/walk", gltf="out/walk",
        vmc=f"127.0.0.1:{receiver.port}",
    )  # fmt: skip
    (tmp_path / "out").mkdir()

    try:
        got, stage = run_body(options, run_context(tmp_path), points)
        messages = receiver.wait_for(3 * (len(HUMANOID) + 3))
    finally:
        receiver.close()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "walk_person3.bvh", "walk_person3.glb", "walk_person3.mot"
    ]  # fmt: skip
    mot = (tmp_path / "out" / "walk_person3.mot").read_text().splitlines()
    assert mot[2] == "nRows=3"
    bvh = (tmp_path / "out" / "walk_person3.bvh").read_text()
    assert "Frames: 3" in bvh and "ROOT root" in bvh
    assert stage.vmc.sent == 3
    times = [args[0] for address, args in messages if address == "/VMC/Ext/T"]
    assert times == pytest.approx([r.capture_ts_ns / 1e9 for r in got])
