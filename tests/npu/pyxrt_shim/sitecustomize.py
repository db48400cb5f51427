"""Run at start-up of a subprocess whose PYTHONPATH starts with this directory: when
$NPUCAM_FAKE_PYXRT names a `device_node` (a file the test created), npu.xrt probes it instead
of /dev/accel/accel0, so the npu backend opens on the fake pyxrt beside it."""

from __future__ import annotations

import json
import os

_node = json.loads(os.environ.get("NPUCAM_FAKE_PYXRT", "{}")).get("device_node")
if _node:
    import npu.xrt

    npu.xrt.DEVICE_NODE = _node
