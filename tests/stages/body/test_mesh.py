"""The mesh topic: a publish stage's MeshTap follows the `mesh/<rig>` subscriptions its XPUB
socket reports; the body stage skins nothing and sends nothing while none is held, and
otherwise sends after each body message the vertices of the model's forward for the pose
that message published, the triangles with the first one after each new subscription."""

from __future__ import annotations

import asyncio

import numpy as np
import zmq
import zmq.asyncio
from body_scenes import PHENOTYPE, observe, walk_and_wave
from stage_items import pose3d, run_context

from pipeline import wire
from pipeline.config import parse_config
from pipeline.graph import Context, Outbox
from pipeline.messages import Result
from pipeline.metrics import Metrics
from pipeline.queues import BoundedQueue
from stages.body.mesh import MeshResult
from stages.body.mesh_topic import MeshTap, run_taps
from stages.body.result import BodyResult
from stages.body.stage import Body, BodyOptions
from stages.publish import Publish, PublishOptions


def test_a_mesh_subscription_is_counted_per_rig_until_unsubscribed():
    tap = MeshTap(["hall", "hall2", "yard"])
    assert not any(tap.wanted(r) for r in ("hall", "hall2", "yard"))
    assert tap.subscription(True, b"mesh/hall")  # a prefix: also matches mesh/hall2
    assert [tap.wanted(r) for r in ("hall", "hall2", "yard")] == [True, True, False]
    assert not tap.subscription(True, b"body/")
    assert not tap.subscription(True, b"mesh/lobby")  # no such rig: not counted
    assert tap.viewers == 1
    tap.subscription(False, b"mesh/hall")
    assert not tap.wanted("hall") and tap.viewers == 0
    assert tap.subscription(True, b"")  # every topic
    assert tap.wanted("yard")


def test_the_triangles_are_due_once_per_new_subscription_of_the_rig():
    tap = MeshTap(["hall", "yard"])
    assert tap.take_triangles("hall") and not tap.take_triangles("hall")  # the first message
    tap.take_triangles("yard")
    tap.subscription(True, b"mesh/h")
    assert tap.take_triangles("hall") and not tap.take_triangles("hall")
    assert not tap.take_triangles("yard")
    tap.subscription(False, b"mesh/h")
    assert not tap.take_triangles("hall")  # leaving asks for nothing


def _run(body_model, tmp_path, frames: int, subscribe: list[bytes]) -> tuple[list, Body]:
    seen = observe(body_model, PHENOTYPE, walk_and_wave(body_model, frames), 1.0, seed=4)
    points = np.concatenate([seen.points308, seen.confidence308[..., None]], axis=-1)

    async def run() -> list:
        context = run_context(tmp_path)
        tap = run_taps(context)["publish"] = MeshTap(["hall"])
        for prefix in subscribe:
            tap.subscription(True, prefix)
        stage = Body("body", BodyOptions(rig="hall", window=2), context)
        inbox = BoundedQueue("body", 8, "block", context.metrics)
        published = BoundedQueue("publish", 16, "block", context.metrics)
        out = Outbox("body", [("publish", (Result,), published)], context.metrics)
        for f in range(frames):
            await inbox.put(pose3d("hall", f, points[f : f + 1]))
        inbox.close()
        await stage.run(inbox, out)
        return [await published.get() for _ in range(len(published))], stage

    return asyncio.run(run())


def test_without_a_mesh_subscriber_no_mesh_is_computed_or_sent(body_model, tmp_path):
    got, stage = _run(body_model, tmp_path, 3, [b"body/", b"pose3d/hall", b"mesh/yard"])
    assert [type(r) for r in got] == [BodyResult] * 3
    assert stage.mesh.made == 0


def test_the_mesh_follows_each_body_message_with_the_models_forward_of_its_pose(
    body_model, tmp_path
):
    got, stage = _run(body_model, tmp_path, 3, [b"mesh/hall"])
    assert [type(r) for r in got] == [BodyResult, MeshResult] * 3
    assert stage.mesh.made == 3
    for body, mesh in zip(got[::2], got[1::2], strict=True):
        assert (mesh.topic, mesh.seq, mesh.capture_ts_ns) == ("mesh/hall", body.seq, body.seq)
        # what a subscriber reads: both messages through the wire
        b = wire.decode(wire.encode_result(body, 0))
        m = wire.decode(wire.encode_result(mesh, 0))
        assert m.header["person_ids"] == b.header["person_ids"] == [3]
        assert m.header["vertex_count"] == len(body_model.template_vertices)
        rest = body_model.rest(b.arrays["phenotype"][0].astype(np.float64))
        posed = body_model.pose(
            rest,
            b.arrays["rotations"][0].astype(np.float64),
            b.arrays["translation"][0].astype(np.float64),
        )
        expected = body_model.skin(rest, posed)
        # float32 on the wire (rotations, translation, phenotype, vertices): ~1e-7 relative
        # at ~1 m, with the rest built from the float32 phenotype
        np.testing.assert_allclose(m.arrays["vertices"][0], expected, atol=2e-5)
    with_triangles = [m.triangles is not None for m in got[1::2]]
    assert with_triangles == [True, False, False]
    triangles = wire.decode(wire.encode_result(got[1], 0)).arrays["triangles"]
    np.testing.assert_array_equal(triangles, body_model.triangles)


async def _until(condition, timeout_s: float = 5.0) -> bool:
    """Polls condition() until true or timeout_s (a subscription takes publish's drain
    period to reach it)."""
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


def test_a_real_publish_stage_feeds_its_mesh_tap_from_its_subscribers(tmp_path):
    config = parse_config(
        {
            "cameras": [{"name": "card", "url": "synthetic:"}],
            "stages": [
                {"kind": "capture"},
                {"kind": "body", "rig": "hall"},
                {"kind": "publish", "bind": "tcp://127.0.0.1:*"},
            ],
        },
        tmp_path / "run.toml",
    )

    async def main() -> list[bool]:
        context = Context(config, Metrics())
        publish = Publish("publish", PublishOptions(bind="tcp://127.0.0.1:*", stats=False), context)
        inbox = BoundedQueue("publish", 8, "block", context.metrics)
        task = asyncio.create_task(publish.run(inbox, Outbox("publish", [], context.metrics)))
        await asyncio.wait_for(publish.bound.wait(), 5)
        tap = run_taps(context)["publish"]
        seen = []
        ctx = zmq.asyncio.Context.instance()
        others = ctx.socket(zmq.SUB)
        others.setsockopt(zmq.LINGER, 0)
        for topic in (b"body/", b"pose3d/hall", b"meta"):
            others.setsockopt(zmq.SUBSCRIBE, topic)
        others.connect(publish.endpoint)
        await _until(lambda: publish.subscription_messages >= 3)
        seen.append(tap.wanted("hall"))
        tap.take_triangles("hall")  # the run's first mesh message carries them
        seen.append(tap.take_triangles("hall"))
        viewer = ctx.socket(zmq.SUB)
        viewer.setsockopt(zmq.LINGER, 0)
        viewer.setsockopt(zmq.SUBSCRIBE, b"mesh/hall")
        viewer.connect(publish.endpoint)
        seen.append(await _until(lambda: tap.wanted("hall")))
        seen.append(tap.take_triangles("hall"))
        viewer.setsockopt(zmq.UNSUBSCRIBE, b"mesh/hall")
        seen.append(await _until(lambda: not tap.wanted("hall")))
        others.close()
        viewer.close()
        inbox.close()
        await task
        return seen

    # nobody for the mesh (no triangles due either); a mesh subscriber, for whom they are
    # due again; gone again
    assert asyncio.run(main()) == [False, False, True, True, True]
