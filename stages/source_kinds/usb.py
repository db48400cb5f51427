"""usb:N cameras: USB / V4L2 device N opened with cv2.VideoCapture(N), read as fast as the
device delivers."""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

from stages.source_kinds.opencv import CaptureSource
from stages.source_kinds.registry import SourceKind

if TYPE_CHECKING:
    from stages.source_kinds.spec import CameraSpec


class UsbKind(SourceKind):
    """target: the device index. Live: probed by the rate frames arrive at."""

    name = "usb"
    schemes = ("usb",)
    forms = ("usb:",)
    live = True
    probe = "live"

    def parse(self, spec: CameraSpec, scheme: str, rest: str) -> int:
        if not re.fullmatch(r"\d+", rest):
            raise spec.error("usb needs a device index: usb:N with N >= 0")
        return int(rest)

    def open(self, spec: CameraSpec, stop: threading.Event) -> CaptureSource:
        return CaptureSource(spec.target, f"usb:{spec.target}")


KIND = UsbKind()
