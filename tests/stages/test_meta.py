"""The meta message: docs/meta.json is current, its keypoint data is
npu/models/sapiens2/keypoints.py's, and every new subscriber of a prefix of `meta` receives it
once, within publish's subscription drain period (a last-value cache), and other subscribers do
not."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from engine_stages import start, subscriber

from npu.models.sapiens2 import keypoints as keypoints308
from pipeline import wire
from stages.meta import contract

DOCS_META = Path(__file__).resolve().parents[2] / "docs" / "meta.json"


def test_docs_meta_json_is_the_contract_the_code_publishes():
    on_disk = json.loads(DOCS_META.read_text())
    assert on_disk == contract(), "docs/meta.json is stale: python -m stages.meta > docs/meta.json"


def test_the_keypoint_data_is_keypoints308s_with_a_colour_per_group():
    pose = contract()["pose"]
    assert pose["count"] == 308 == len(pose["names"]) == len(pose["group_of"])
    assert pose["names"] == list(keypoints308.NAMES)
    groups = {g["name"]: g for g in pose["groups"]}
    assert set(groups) == {"body", "feet", "hands", "face"}
    for name, indices in keypoints308.GROUPS.items():
        assert [i for i, g in enumerate(pose["group_of"]) if g == name] == list(indices)
        assert groups[name]["count"] == len(indices)
        assert re.fullmatch(r"#[0-9a-f]{6}", groups[name]["color"])
    assert len({g["color"] for g in groups.values()}) == 4
    edges = {(keypoints308.NAMES[a], keypoints308.NAMES[b]): g for a, b, g in pose["skeleton"]}
    assert len(edges) == len(keypoints308.SKELETON)
    assert edges[("left_hip", "right_hip")] == "body"
    assert edges[("left_ankle", "left_big_toe")] == "feet"  # body -> feet: the limb's colour
    assert edges[("left_elbow", "left_wrist")] == "hands"
    assert edges[("right_wrist", "right_thumb_third_joint")] == "hands"


def test_every_new_subscriber_of_meta_gets_it_first_and_a_det_subscriber_does_not(write_config):
    path = write_config(
        """
        [metrics]
        stats_interval_s = 0
        [[cameras]]
        name = "card"
        url = "synthetic:?width=64&height=48&fps=20"
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        """
    )

    async def messages_for(sub, seconds: float) -> list[wire.Message]:
        got, end = [], asyncio.get_running_loop().time() + seconds
        while (left := end - asyncio.get_running_loop().time()) > 0:
            if await sub.poll(int(left * 1000) + 1):
                got.append(wire.decode(await sub.recv_multipart()))
        return got

    async def main():
        pipeline, task = await start(path, duration=30)
        everything = await subscriber(pipeline, topic="")
        first = await messages_for(everything, 1.0)
        det_only = await subscriber(pipeline, topic="det/")  # later ones, while det/ flows
        meta_only = await subscriber(pipeline, topic="meta")
        late_meta = await messages_for(meta_only, 1.0)
        late_det = await messages_for(det_only, 0.5)
        for s in (everything, det_only, meta_only):
            s.close()
        pipeline.stop()
        return await task, first, late_meta, late_det

    code, first, late_meta, late_det = asyncio.run(main())
    assert code == 0
    topics = [m.topic for m in first]
    assert topics.count("meta") == 1 and topics.count("det/card") >= 10
    assert topics.index("meta") < 10  # det/ sent before publish read the subscription (0.1 s)
    (meta,) = late_meta
    assert meta.topic == "meta" and meta.header["kind"] == "meta" and meta.arrays == {}
    assert meta.header["meta"]["cameras"] == ["card"]
    assert meta.header["meta"]["pose"] == contract()["pose"]
    assert late_det and {m.topic for m in late_det} == {"det/card"}


def test_the_body_entry_names_the_bones_their_parents_and_the_fitted_keypoints():
    body = contract()["body"]
    assert body["bones"][0] == "root" and body["parents"][0] == -1
    assert len(body["bones"]) == len(body["parents"]) == 104
    for bone, parent in zip(body["bones"][1:], body["parents"][1:], strict=True):
        assert 0 <= parent < body["bones"].index(bone)  # parents precede their children
    assert body["bones"][body["parents"][body["bones"].index("lowerarm01.L")]] == "upperarm02.L"
    assert set(body["fitted_bones"] + body["finger_bones"]) <= set(body["bones"])
    assert set(body["finger_keypoints"]) <= set(keypoints308.NAMES)
    assert set(body["keypoints"]) <= set(keypoints308.NAMES)  # named as meta.pose's
    assert "left_wrist" in body["keypoints"] and body["keypoints_from"] == "pose"
    assert body["phenotype_labels"] == ["gender", "age", "muscle", "weight", "height",
                                        "proportions"]  # fmt: skip
    assert [p["name"] for p in body["parts"]] == [
        "rotations", "translation", "phenotype", "keypoints", "residuals"
    ]  # fmt: skip
    assert body["mesh"]["topic"] == "mesh/<rig>"
