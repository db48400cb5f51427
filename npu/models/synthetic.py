"""Small synthetic-weight models with the real interfaces, for demos and tests without weights.

Each registered model may name a synthetic module (ModelSpec.synthetic, e.g.
npu.models.sapiens2.synthetic) that builds it in numpy from a fixed seed (no torch): random
weights at tiny widths and depths, but the interfaces of the released model, so every stage
downstream runs unchanged. Their outputs mean nothing; whatever publishes them says
`synthetic: true`. Each is available on the cpu backend and, written once into a cache
directory as a bundle the simulated NPU runs, on sim; the weights are the same on both (the
bundle is written from the cpu model). A synthetic module defines MODEL_ID, VERSION (bumped
when the model changes, so cached bundles are rebuilt), `cpu(cache)` and
`write_bundle(out, cache)`. Every directory written here holds a MARKER file, so a model
loaded from it by path (`--model DIR`, `bundle = DIR`) is still known to be synthetic.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pipeline.errors import NpucamError

MARKER = "SYNTHETIC"  # in every synthetic checkpoint or bundle directory
MARKER_TEXT = "npucam synthetic stand-in: random weights from a fixed seed; outputs mean nothing\n"


class SyntheticError(NpucamError):
    """An unknown synthetic model or backend, or a cache directory that cannot be written."""


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """float32 N(0, scale²) of `shape`: the synthetic models' weights."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def module(name: str) -> ModuleType:
    """The synthetic module of registered model `name`."""
    from npu.models import ModelLoadError, spec

    try:
        path = spec(name).synthetic
    except ModelLoadError:
        path = None
    if path is None:
        from npu.models import names

        known = [n for n in names() if spec(n).synthetic]
        raise SyntheticError(f"no synthetic model {name!r} (known: {', '.join(known)})")
    return importlib.import_module(path)


def model_id(name: str) -> str:
    """The model id results of the synthetic `name` carry."""
    return module(name).MODEL_ID


def cache_root(cache: str | Path | None = None) -> Path:
    """Where synthetic checkpoints and bundles live: `cache`, else <asset cache>/synthetic."""
    if cache is not None:
        return Path(cache)
    from pipeline.assets import cache_dir

    return cache_dir() / "synthetic"


def is_synthetic(path: str | Path) -> bool:
    """Whether path is (or is inside) a directory of synthetic weights (it holds MARKER)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return (folder / MARKER).is_file()


def written_once(path: Path, write: Any) -> Path:
    """Run write(tmp_dir) into a sibling temp dir, mark it synthetic (MARKER) and rename it
    to path, unless path exists (another process may have won the race: its copy is kept;
    one written before markers existed gets its marker now)."""
    if path.is_dir():
        if not (path / MARKER).is_file():
            with contextlib.suppress(OSError):
                (path / MARKER).write_text(MARKER_TEXT)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        staged = tmp / "out"
        write(staged)
        (staged / MARKER).write_text(MARKER_TEXT)
        try:
            os.rename(staged, path)
        except OSError:
            if not path.is_dir():
                raise
    except OSError as exc:
        raise SyntheticError(f"{path}: cannot write the synthetic model: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def bundle_path(name: str, cache: str | Path | None = None) -> Path:
    """The synthetic model's sim bundle in the cache, written on first use."""
    mod = module(name)
    path = cache_root(cache) / f"{name}-bundle-v{mod.VERSION}"
    return written_once(path, lambda out: mod.write_bundle(out, cache))


def load(name: str, backend: str, device: Any = None, cache: str | Path | None = None) -> Any:
    """A synthetic model on `backend`: "cpu" (numpy), or "sim" on `device` (a SimDevice; a
    new one if None)."""
    mod = module(name)
    if backend == "cpu":
        return mod.cpu(cache)
    if backend != "sim":
        raise SyntheticError(
            f"synthetic {name}: backend {backend!r}; synthetic models run on cpu or sim only "
            "(hardware bundles come from IRON's exporter)"
        )
    from npu.backends import open_device
    from npu.models import spec

    return spec(name).from_bundle(bundle_path(name, cache), device or open_device("sim"))
