"""The ANNY references shared by the body tests: the model built by `make setup` and, from
the test extra, anny's own `Anny()` (its built data cached under the ignored asset cache,
~3.5 min to build the first time, ~5 s to load after)."""

from __future__ import annotations

import os

import pytest

from pipeline.assets import ANNY_MODEL, asset_path, cache_dir
from stages.body.model import AnnyModel


@pytest.fixture(scope="session")
def body_model() -> AnnyModel:
    return AnnyModel.load(asset_path(ANNY_MODEL))


@pytest.fixture(scope="session")
def anny_reference():
    """anny's Anny() (rig "anny", local-ref poses) with dense linear blend skinning."""
    os.environ["ANNY_CACHE_DIR"] = str(cache_dir() / "anny-reference")
    import anny.paths

    anny.paths.set_anny_cache_path(os.environ["ANNY_CACHE_DIR"])
    return anny.Anny(skinning_method="lbs")
