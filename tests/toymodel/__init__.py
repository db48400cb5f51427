"""A toy fourth model for the plug-in test (tests/test_toy_model.py): an image's colours in a
3 x 8 x 8 grid -> 4 numbers through one device GEMM, on every tracked person of every frame.
Nothing of npucam is edited for it: this package's MODEL is its one registry entry (with what
it runs on), and its runtime and stages live here too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npu.models import ModelSpec, RunsOn


def _from_checkpoint(path: Path) -> Any:
    from tests.toymodel.model import ToyModel

    return ToyModel.from_weights(path)


def _from_bundle(path: Path, device: Any) -> Any:
    from tests.toymodel.model import ToyModel

    return ToyModel.from_bundle(path, device)


MODEL = ModelSpec(
    name="toy",
    kind="toy",
    runtime="tests.toymodel.runtime:ToyRuntime",
    from_checkpoint=_from_checkpoint,
    from_bundle=_from_bundle,
    runs_on=RunsOn("person", "frame"),
)
