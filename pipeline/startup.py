"""The run's start barrier: stages that open slowly (models loaded by infer and detect) say
so when they are built and again once open, and the sources start reading only when every
one has, so the first frames are not read while the models still load.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Startup:
    """One run's stages still opening. Get it with Startup.of(context); expect() in a stage's
    __init__, opened() on the event loop once it is open (or has failed: a stage that dies
    stops the run, and the sources with it), wait() in a source before it reads."""

    def __init__(self) -> None:
        self._opening: set[str] = set()
        self._changed = asyncio.Event()

    @classmethod
    def of(cls, context: Any) -> Startup:
        return context.shared("pipeline.startup", cls)

    def expect(self, stage: str) -> None:
        self._opening.add(stage)

    def opened(self, stage: str) -> None:
        self._opening.discard(stage)
        self._changed.set()

    @property
    def opening(self) -> tuple[str, ...]:
        """The stages not open yet, by name."""
        return tuple(sorted(self._opening))

    async def wait(self) -> None:
        """Until every expected stage has opened."""
        while self._opening:
            self._changed.clear()
            await self._changed.wait()
