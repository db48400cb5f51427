"""The ANNY references shared by the body tests: the model built by `make setup` and, from
the test extra, anny's own `Anny()` (anny_reference.py; `make setup-test` builds its data)."""

from __future__ import annotations

import pytest

from pipeline.assets import ANNY_MODEL, asset_path
from stages.body.model import AnnyModel
from tests.stages.body import anny_reference as reference


@pytest.fixture(scope="session")
def body_model() -> AnnyModel:
    return AnnyModel.load(asset_path(ANNY_MODEL))


@pytest.fixture(scope="session")
def anny_reference():
    """anny's Anny() (rig "anny", local-ref poses) with dense linear blend skinning."""
    return reference.load()
