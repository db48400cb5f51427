"""The `mesh/<rig>` message: the fitted bodies' skinned vertices, stages/body/model.py's
forward (AnnyModel.skin of AnnyModel.pose) for each pose a body/<rig> message publishes
(docs/protocol.md, "mesh"); the body stage makes it only while stages/body/mesh_topic.py's
taps say a subscriber wants it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Result
from stages.body.model import AnnyModel, Posed, RestBody
from stages.body.result import BodyResult


@dataclass(slots=True, kw_only=True)
class MeshResult(Result):
    """The skinned ANNY vertices of one body/<rig> message's people: vertices float32
    [P, V, 3] (m, the calibration's frame; rows: the model's vertex order), person_ids as the
    body message's; triangles int32 [T, 3] vertex indices (counter-clockwise seen from
    outside), or None when this message does not carry them."""

    kind: str = "mesh"
    person_ids: tuple[int, ...] = ()
    vertices: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 3), np.float32))
    triangles: np.ndarray | None = None

    def header_fields(self) -> dict:
        return {
            **self.extra,
            "rig": self.camera,
            "count": len(self.person_ids),
            "person_ids": [int(i) for i in self.person_ids],
            "vertex_count": int(self.vertices.shape[1]),
            "has_triangles": self.triangles is not None,
            "units": "m",
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        parts = [("vertices", np.asarray(self.vertices, np.float32))]
        if self.triangles is not None:
            parts.append(("triangles", np.asarray(self.triangles, np.int32)))
        return parts


class BodyMesh:
    """Skins a body result's poses; each person's rest mesh is kept while its phenotype
    stays the same (it is held after the fit's window)."""

    def __init__(self, model: AnnyModel) -> None:
        self.model = model
        self._rest: dict[int, RestBody] = {}
        self.made = 0  # mesh messages made

    def vertices(
        self, rest: RestBody, rotations: np.ndarray, translation: np.ndarray
    ) -> np.ndarray:
        """float64 [V, 3]: AnnyModel.skin(rest, pose(rest, rotations, translation))."""
        posed: Posed = self.model.pose(rest, rotations, translation)
        return self.model.skin(rest, posed)

    def rest(self, person: int, phenotype: np.ndarray) -> RestBody:
        """The person's rest body with its mesh, rebuilt when the phenotype changed."""
        phenotype = np.asarray(phenotype, np.float64)
        rest = self._rest.get(person)
        if rest is None or not np.array_equal(rest.phenotype, phenotype):
            rest = self._rest[person] = self.model.rest(phenotype)
        return rest

    def result(self, body: BodyResult, triangles: bool) -> MeshResult:
        """The mesh message of a body message (triangles: include them)."""
        v = len(self.model.template_vertices)
        vertices = np.empty((len(body.person_ids), v, 3), np.float32)
        for p, person in enumerate(body.person_ids):
            rest = self.rest(person, body.phenotype[p])
            vertices[p] = self.vertices(rest, body.rotations[p], body.translation[p])
        for person in set(self._rest) - set(body.person_ids):
            del self._rest[person]
        self.made += 1
        return MeshResult(
            camera=body.camera,
            seq=body.seq,
            capture_ts_ns=body.capture_ts_ns,
            deadline_ns=body.deadline_ns,
            backend=body.backend,
            model=body.model,
            synthetic=body.synthetic,
            person_ids=body.person_ids,
            vertices=vertices,
            triangles=self.model.triangles if triangles else None,
        )
