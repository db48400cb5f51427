"""The registry of models npucam runs (npu.models.loading has the one way to load one:
`load(name, source, backend, device)`).

Each model is a package, npu.models.<name>, laid out like its taconite crate (config,
preprocess, model, checkpoint, npu, export, post, check, synthetic); its `__init__` holds a
`MODEL` ModelSpec that names its loaders and declares what the pipeline needs to know of it.
A model outside this package registers its own spec with `register` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import NpucamError

BACKENDS = ("cpu", "sim", "npu")
BUILTIN = ("npu.models.sapiens2", "npu.models.adaface", "npu.models.clip")


class ModelLoadError(NpucamError):
    """A model that cannot be loaded as asked: unknown name, missing path, wrong backend."""


Target = Literal["person", "face", "frame", "region"]
Cadence = Literal["frame", "interval", "refresh"]


@dataclass(frozen=True)
class RunsOn:
    """What a model runs on and how often (stages/job_policy.py decides from it).

    target: "person" (a tracked person's box), "face" (a face with alignment landmarks),
      "frame" (the whole frame) or "region" (the detect stage's regions: person boxes or
      the frame, its `clip` key).
    cadence: "frame" (every target of every frame), "interval" (every target of a frame at
      most once per interval_s of capture time per camera) or "refresh" (the tracked persons
      whose last result is oldest, max_per_frame a frame, one in flight per track).
    interval_s, max_per_frame: the defaults; the detect stage's keys of that target set
      them where it has them (face_interval_s, clip_interval_s, pose_jobs_per_frame...).
    """

    target: Target
    cadence: Cadence = "frame"
    interval_s: float = 0.0
    max_per_frame: int | None = None


@dataclass(frozen=True)
class ModelSpec:
    """What the pipeline knows of one model.

    name: its config table ([stages.<name>] in an infer stage) and registry key.
    kind: the result kind its outputs become (pose, face, clip: the message kinds).
    runtime: "module:Class" of the stages.runtimes.Runtime that plugs it into the infer stage
      (named, not imported: npu imports nothing of stages).
    from_checkpoint(path) -> model on the cpu backend; from_bundle(path, device) -> model on
      a device; model_id(model, path) -> the id results carry (path: where it was loaded
      from, or the synthetic stand-in's MODEL_ID).
    synthetic: module path of its synthetic-weight stand-in (npu.models.synthetic reads it),
      or None when it has none.
    wire_meta() -> the facts a subscriber needs to read this model's results (its section of
      the `meta` message, docs/protocol.md), or None.
    export_batch(model, bundle_dir) -> items per device pass (bundle_dir None on cpu);
      default_batch: the same for the released bundles, when no model is loaded (planning).
    npu2: module path of its released variants' NPU2 dispatch lists (npu.sim_cost; the
      module defines VARIANTS, work(variant) -> ModelWork and variant_of_bundle(path)), or
      None; stands_in_for: the released variant its synthetic model stands in for (the
      paced simulator charges the synthetic model that variant's NPU2 time).
    runs_on: what it runs on and how often (RunsOn), None for a model the detect stage
      makes no jobs for (its jobs come from a stage of its own).
    """

    name: str
    kind: str
    runtime: str
    from_checkpoint: Callable[[Path], Any]
    from_bundle: Callable[[Path, Any], Any]
    synthetic: str | None = None
    model_id: Callable[[Any, Path], str] = field(default=lambda model, path: path.name)
    export_batch: Callable[[Any, Path | None], int] = field(default=lambda model, path: 1)
    default_batch: int = 1
    wire_meta: Callable[[], dict] | None = None
    npu2: str | None = None
    stands_in_for: str | None = None
    runs_on: RunsOn | None = None


_REGISTRY: dict[str, ModelSpec] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for package in BUILTIN:
        spec = importlib.import_module(package).MODEL
        _REGISTRY.setdefault(spec.name, spec)


def register(spec: ModelSpec) -> None:
    """Add a model; a name already registered is an error (no silent replacement)."""
    _load_builtins()
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ModelLoadError(f"model {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def unregister(name: str) -> None:
    """Remove a model registered with `register` (tests that add one clean up with this)."""
    _load_builtins()
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered model, built-ins first."""
    _load_builtins()
    return tuple(_REGISTRY)


def spec(name: str, where: str = "") -> ModelSpec:
    """The spec of model `name`; ModelLoadError naming `where` (a config key) if unknown."""
    _load_builtins()
    if name not in _REGISTRY:
        raise ModelLoadError(f"{where or name}: unknown model (known: {', '.join(_REGISTRY)})")
    return _REGISTRY[name]


def npu2_module(name: str) -> Any:
    """Model `name`'s NPU2 dispatch-list module (ModelSpec.npu2), or None when it has none."""
    path = spec(name).npu2
    return None if path is None else importlib.import_module(path)


def npu2_work(name: str, variant: str) -> Any:
    """The released `variant` of model `name` on NPU2 (an npu.sim_cost.ModelWork);
    ModelLoadError naming the variants when it has no such one."""
    mod = npu2_module(name)
    if mod is None or variant not in mod.VARIANTS:
        known = ", ".join(mod.VARIANTS) if mod is not None else "none"
        raise ModelLoadError(f"{name}: no released variant {variant!r} (known: {known})")
    return mod.work(variant)


def released_variant(name: str, bundle_dir: Path | None, synthetic: bool) -> str | None:
    """The released variant a loaded model is: its synthetic model's `stands_in_for`, or
    the variant a bundle's params show (None when unknown or on cpu)."""
    mod = npu2_module(name)
    if mod is None:
        return None
    if synthetic:
        return spec(name).stands_in_for
    if bundle_dir is None or not (Path(bundle_dir) / "manifest.txt").is_file():
        return None
    return mod.variant_of_bundle(Path(bundle_dir))


def bundle_batch(bundle_dir: Path | None) -> int:
    """Items per device pass of a bundle that may declare `param batch N`: N, else one (and
    one on cpu, where bundle_dir is None)."""
    if bundle_dir is None or not (bundle_dir / "manifest.txt").is_file():
        return 1
    from npu.bundle import Bundle

    bundle = Bundle.open(bundle_dir)
    try:
        return bundle.param("batch", int) if bundle.has_param("batch") else 1
    finally:
        bundle.close()
