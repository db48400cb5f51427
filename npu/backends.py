"""The one device factory: the device a backend name runs on (cpu: none, npu: the process's XRT
device, sim: a new simulated NPU), kept out of npu/device so that no device imports it back.
"""

from __future__ import annotations

from typing import Any

from npu.device.errors import DeviceError
from npu.device.protocol import Device

DEVICE_BACKENDS = ("sim", "npu")


def open_device(backend: str, **sim_options: Any) -> Device | None:
    """The device a backend runs on: None for cpu (numpy needs none); the process's one XRT
    device for npu (npu.xrt; a DeviceError names what is missing); a new simulated NPU for
    sim, built with `sim_options` (npu.sim.SimDevice's keywords: cost, sleep, registry_dir,
    hwctx_limit, faults). A device passed where a backend name is expected is returned as is."""
    if not isinstance(backend, str):
        return backend
    if backend == "cpu":
        return None
    if backend == "npu":
        if sim_options:
            raise DeviceError(f"backend npu: sim options given: {', '.join(sim_options)}")
        from npu.xrt import xrt_device

        return xrt_device()
    if backend == "sim":
        from npu.sim import SimDevice

        return SimDevice(**sim_options)
    raise DeviceError(f"backend {backend!r}: expected cpu, {' or '.join(DEVICE_BACKENDS)}")
