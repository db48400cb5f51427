"""The `body` stage: `pose3d/<rig>` results -> `body/<rig>` (docs/body.md).

Each Pose3DResult of its rig goes to stages.body.people.BodyPeople (one BodyTracker per rig
person id) on a worker thread; the BodyResult follows the pose3d result's seq, capture time
and deadline. While a subscriber of a publish stage it sends to asks for `mesh/<rig>`
(stages/body/mesh_topic.py), the fitted bodies' skinned vertices follow each result there. The
model is loaded once when the stage is built, from the set-up's file
(pipeline/assets.py `fetch_body_model`). With `trc`, each person's fitted keypoints are
written as an OpenSim .trc file at shutdown (stages.rig.trc, as rig3d's `trc`), and with
`mot`, `bvh`, `gltf` its joint angles, motion and last mesh (stages/body/recording.py); with
`vmc`, one person's pose is sent live over the VMC protocol (stages/body/exports/vmc.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
from pydantic import Field

from pipeline.assets import ANNY_MODEL, asset_path
from pipeline.config import NAME_PATTERN
from pipeline.graph import Outbox, Stage, StageOptions
from pipeline.queues import BoundedQueue, QueueClosed
from stages.body.exports.gltf import pygltflib
from stages.body.exports.vmc import VmcError, VmcSender
from stages.body.fit import FitConfig
from stages.body.mesh import BodyMesh
from stages.body.mesh_topic import MeshTap
from stages.body.mesh_topic import run_taps as mesh_taps
from stages.body.model import AnnyModel, RestBody
from stages.body.people import BodyPeople
from stages.body.recording import BodyRecording
from stages.body.result import BodyResult
from stages.rig.pose3d import Pose3DResult

log = logging.getLogger(__name__)


class BodyOptions(StageOptions):
    rig: str = Field(pattern=NAME_PATTERN)  # fits pose3d/<rig>, publishes body/<rig>
    window: int = Field(30, ge=1, le=100000)  # frames the phenotype is fitted over
    iterations: int = Field(6, ge=1, le=100)  # LM steps a frame
    robust_scale_m: float = Field(0.04, gt=0)  # the Cauchy loss's scale
    min_confidence: float = Field(0.3, ge=0, le=1)  # keypoints below are missing
    fingers: bool = False  # also fit the finger bones to the hands' joints (docs/body.md)
    person_max_age: int = Field(30, ge=1)  # pose3d groups a body outlives its person
    trc: str | None = Field(None, min_length=1)  # .trc path stem (relative to the config)
    mot: str | None = Field(None, min_length=1)  # OpenSim .mot joint angles, path stem
    bvh: str | None = Field(None, min_length=1)  # BVH motion, path stem
    gltf: str | None = Field(None, min_length=1)  # glTF (.glb) of the last mesh, path stem
    # frames recorded per person for the files above; later frames are not recorded
    trc_max_frames: int = Field(9000, ge=1)
    vmc: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]+:[0-9]{1,5}$")  # HOST:PORT
    vmc_person: int | None = Field(None, ge=0)  # rig person sent (default: lowest fitted id)


class Body(Stage[BodyOptions]):
    """Pose3DResult of one rig -> BodyResult on body/<rig> (module docstring)."""

    kind = "body"
    accepts = (Pose3DResult,)
    Options = BodyOptions

    def __init__(self, name: str, options: BodyOptions, context: Any) -> None:
        super().__init__(name, options, context)
        o = options
        config = FitConfig(
            window=o.window,
            iterations=o.iterations,
            robust_scale=o.robust_scale_m,
            min_confidence=o.min_confidence,
            fingers=o.fingers,
        )
        self.model = model = AnnyModel.load(asset_path(ANNY_MODEL))
        self.people = BodyPeople(model, config, o.person_max_age)
        self.mesh = BodyMesh(model)
        self.metrics.add_gauges(name, self._gauges)
        base = context.config.base_dir
        paths = {
            fmt: base / stem
            for fmt, stem in (("trc", o.trc), ("mot", o.mot), ("bvh", o.bvh), ("gltf", o.gltf))
            if stem is not None
        }
        if o.gltf is not None:
            pygltflib()  # missing: say so now, not at shutdown
        self.recording = BodyRecording(model, paths, o.trc_max_frames) if paths else None
        self.vmc: VmcSender | None = None
        if o.vmc is not None:
            host, _, port = o.vmc.rpartition(":")
            self.vmc = VmcSender(model, host, int(port))
        self._vmc_rest: dict[int, RestBody] = {}

    def _gauges(self) -> dict[str, float]:
        return {"meshes": self.mesh.made, "vmc_frames": self.vmc.sent if self.vmc else 0}

    async def run(self, inbox: BoundedQueue | None, out: Outbox) -> None:
        assert inbox is not None
        try:
            while True:
                try:
                    item = await inbox.get()
                except QueueClosed:
                    return
                if item.camera != self.options.rig:
                    continue
                try:
                    result = await asyncio.to_thread(self.people.fit, item)
                except Exception:
                    self.item_failed(item)
                    continue
                if self.recording is not None:
                    self.recording.add(result)
                if self.vmc is not None and result.person_ids:
                    try:
                        await asyncio.to_thread(self._send_vmc, result)
                    except VmcError as exc:
                        log.warning("stage %s: %s", self.name, exc)
                await out.send(result)
                taps = self._mesh_taps(out)
                if any(tap.wanted(result.camera) for tap in taps):
                    triangles = any([tap.take_triangles(result.camera) for tap in taps])
                    try:
                        mesh = await asyncio.to_thread(self.mesh.result, result, triangles)
                    except Exception:
                        self.item_failed(result)
                        continue
                    await out.send(mesh)
        finally:
            if self.recording is not None:
                await asyncio.to_thread(self.recording.write, self.name)

    def _mesh_taps(self, out: Outbox) -> list[MeshTap]:
        """The mesh taps of the publish stages this stage sends to."""
        taps = mesh_taps(self.context)
        return [taps[name] for name, _, _ in out.targets if name in taps]

    def _send_vmc(self, result: BodyResult) -> None:
        """The chosen person's pose (vmc_person, or the lowest fitted id) over VMC."""
        assert self.vmc is not None
        wanted = self.options.vmc_person
        ids = list(result.person_ids)
        person = min(ids) if wanted is None else wanted
        if person not in ids:
            return
        p = ids.index(person)
        phenotype = np.asarray(result.phenotype[p], np.float64)
        rest = self._vmc_rest.get(person)
        if rest is None or not np.array_equal(rest.phenotype, phenotype):
            rest = self.model.rest(phenotype, vertices=False)
            self._vmc_rest = {person: rest}
        self.vmc.send(rest, result.rotations[p], result.translation[p], result.capture_ts_ns / 1e9)
