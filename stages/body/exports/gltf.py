"""glTF 2.0 binary (.glb) of fitted ANNY meshes through pygltflib (optional extra `export`):
one node and mesh per body, positions float32 in metres, Y up (the .trc files' axes,
stages/body/exports/axes.py), triangles uint32 counter-clockwise seen from outside (glTF's
front faces).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from pipeline.errors import NpucamError
from stages.body.exports.axes import points_yup


class GltfError(NpucamError):
    """Inputs the glTF writer cannot write, or pygltflib missing; says which."""


def pygltflib() -> ModuleType:
    """The pygltflib module, or GltfError saying how to install it."""
    try:
        import pygltflib as module
    except ImportError:
        raise GltfError(
            "glTF export needs pygltflib: pip install 'npucam[export]' (pyproject.toml)"
        ) from None
    return module


def write_gltf(
    path: str | os.PathLike,
    bodies: Sequence[np.ndarray],
    triangles: np.ndarray,
    names: Sequence[str] | None = None,
) -> None:
    """bodies: vertices [V, 3] each (m, npucam's Z-up world: stages/body/mesh.py's or
    AnnyModel.skin's), sharing triangles int [T, 3]; names: one per body (node names)."""
    g = pygltflib()
    triangles = np.asarray(triangles)
    names = [f"body{i}" for i in range(len(bodies))] if names is None else list(names)
    if triangles.ndim != 2 or triangles.shape[1] != 3 or not len(bodies):
        raise GltfError(f"triangles must be [T, 3] and bodies not empty, got {triangles.shape}")
    if len(names) != len(bodies):
        raise GltfError(f"{len(names)} names for {len(bodies)} bodies")
    count = max(int(np.asarray(b).shape[0]) for b in bodies)
    if triangles.min() < 0 or triangles.max() >= count:
        raise GltfError(
            f"triangles index vertices 0..{count - 1}: {triangles.min()}..{triangles.max()}"
        )
    index = triangles.astype(np.uint32).tobytes()
    blob = bytearray(index)
    accessors = [
        g.Accessor(
            bufferView=0,
            componentType=g.UNSIGNED_INT,
            count=int(triangles.size),
            type=g.SCALAR,
            min=[int(triangles.min())],
            max=[int(triangles.max())],
        )
    ]
    views = [g.BufferView(buffer=0, byteLength=len(index), target=g.ELEMENT_ARRAY_BUFFER)]
    meshes, nodes = [], []
    for i, vertices in enumerate(bodies):
        v = np.ascontiguousarray(points_yup(np.asarray(vertices, np.float64)), np.float32)
        if v.ndim != 2 or v.shape[1] != 3 or not np.isfinite(v).all():
            raise GltfError(f"bodies[{i}]: vertices must be finite [V, 3], got {v.shape}")
        views.append(
            g.BufferView(buffer=0, byteOffset=len(blob), byteLength=v.nbytes, target=g.ARRAY_BUFFER)
        )
        blob += v.tobytes()
        accessors.append(
            g.Accessor(
                bufferView=len(views) - 1,
                componentType=g.FLOAT,
                count=len(v),
                type=g.VEC3,
                min=v.min(axis=0).tolist(),
                max=v.max(axis=0).tolist(),
            )
        )
        primitive = g.Primitive(attributes=g.Attributes(POSITION=len(accessors) - 1), indices=0)
        meshes.append(g.Mesh(name=names[i], primitives=[primitive]))
        nodes.append(g.Node(name=names[i], mesh=i))
    gltf = g.GLTF2(
        asset=g.Asset(generator="npucam stages/body/exports/gltf.py", version="2.0"),
        scene=0,
        scenes=[g.Scene(nodes=list(range(len(nodes))))],
        nodes=nodes,
        meshes=meshes,
        accessors=accessors,
        bufferViews=views,
        buffers=[g.Buffer(byteLength=len(blob))],
    )
    gltf.set_binary_blob(bytes(blob))
    path = Path(path)
    try:
        gltf.save_binary(str(path))
    except OSError as exc:
        raise GltfError(f"{path}: cannot write: {exc.strerror or exc}") from None
