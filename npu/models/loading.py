"""Loading a registered model (npu.models): from its checkpoint (cpu) or bundle (sim, npu), or
its synthetic-weight stand-in (npu.models.synthetic) where the config allows it; apart from
the registry so that the synthetic models, which look their specs up there, form no circle."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npu.models import BACKENDS, ModelLoadError, ModelSpec, spec, synthetic
from pipeline.files import path_kind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: `checkpoint` (cpu) or `bundle` (sim, npu), else synthetic
    weights if `synthetic` allows it. `where` names the config key of this model."""

    checkpoint: str | None = None
    bundle: str | None = None
    synthetic: bool = False
    where: str = ""


@dataclass(frozen=True)
class Loaded:
    """A loaded model: the model object, the id its results carry, whether its weights are
    synthetic, and the bundle it runs from (None on cpu)."""

    spec: ModelSpec
    model: Any
    model_id: str
    synthetic: bool
    bundle_dir: Path | None


def load(
    name: str,
    source: ModelSource,
    backend: str,
    device: Any = None,
    synthetic_cache: str | Path | None = None,
) -> Loaded:
    """Load model `name` on `backend` from `source`; device is the open device for sim / npu
    (npu.backends.open_device), None for cpu. Without a path that exists, the synthetic model
    when `source.synthetic` allows it (sim and cpu only; logged as a warning); otherwise a
    ModelLoadError naming the config key and what to set."""
    model_spec = spec(name, source.where)
    if backend not in BACKENDS:
        raise ModelLoadError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    key = "checkpoint" if backend == "cpu" else "bundle"
    raw = source.checkpoint if backend == "cpu" else source.bundle
    # a config key gets the path's key appended; a command-line option ("--model") is whole
    where = (
        f"{source.where}.{key}"
        if source.where and not source.where.startswith("-")
        else (source.where or key)
    )
    path = Path(raw) if raw else None
    if path is not None and path_kind(path) != "missing":
        if backend == "cpu":
            model = model_spec.from_checkpoint(path)
        else:
            model = model_spec.from_bundle(path, device)
        bundle_dir = None if backend == "cpu" else path
        marked = synthetic.is_synthetic(path)  # synthetic weights named by their path
        return Loaded(model_spec, model, model_spec.model_id(model, path), marked, bundle_dir)
    if not source.synthetic:
        missing = "is not set" if path is None else f"= {path} does not exist"
        raise ModelLoadError(
            f"{where} {missing} (backend {backend} needs "
            f"{'an HF checkpoint directory' if backend == 'cpu' else 'a bundle directory'}; "
            "or set synthetic = true for the small synthetic-weight model)"
        )
    if backend == "npu":
        raise ModelLoadError(
            f"{where}: {'no path set' if path is None else f'{path} does not exist'}, and "
            "synthetic models have no hardware bundle (use backend sim or cpu, or give the "
            "bundle path)"
        )
    reason = "not set" if path is None else f"{path} does not exist"
    log.warning(
        "%s: %s; using the SYNTHETIC %s (random weights, outputs are meaningless)",
        where,
        reason,
        name,
    )
    model = synthetic.load(name, backend, device, cache=synthetic_cache)
    bundle_dir = None if backend == "cpu" else synthetic.bundle_path(name, synthetic_cache)
    model_id = model_spec.model_id(model, Path(synthetic.model_id(name)))
    return Loaded(model_spec, model, model_id, True, bundle_dir)
