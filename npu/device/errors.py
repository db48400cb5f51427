"""The errors of the device layer: a device could not open, a kernel load or a run failed, a
dispatch passed its deadline, the device was marked failed or is stopping.
"""

from __future__ import annotations

from pipeline.errors import NpucamError


class DeviceError(NpucamError):
    """A device could not be opened, a kernel could not be loaded or a run failed."""


class DeviceTimeout(DeviceError):
    """A dispatch passed its deadline: its job fails (`device_timeout`), its context is
    parked and its kernel reloaded in a fresh one."""


class DeviceFailed(DeviceTimeout):
    """The device is marked failed after hung dispatches (a reloaded kernel hung again, or
    too many contexts are parked): every later dispatch fails at once."""


class DeviceInterrupted(DeviceError):
    """The device is stopping (interrupt()): waits in progress were given up."""
