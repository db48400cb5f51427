"""`import pyxrt` in a subprocess whose PYTHONPATH starts with this directory: the test fake
(tests/npu/fake_pyxrt.py), configured from $NPUCAM_FAKE_PYXRT (JSON for fake_pyxrt.configure;
sitecustomize.py here reads its `device_node`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fake_pyxrt  # noqa: E402

fake_pyxrt.configure(json.loads(os.environ.get("NPUCAM_FAKE_PYXRT", "{}")))
sys.modules[__name__] = fake_pyxrt
