"""Reliability tests reuse the capture tests' loopback cameras (tests/stages/mjpeg_server.py)
and the engine tests' runners (tests/pipeline/engine_stages.py, put on sys.path by
tests/conftest.py)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))


@pytest.fixture(autouse=True)
def no_threads_left_behind():
    """Every reliability test ends with the threads it started gone (capture readers, server
    client threads, executor workers get a moment to finish)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    import time

    end = time.monotonic() + 5.0
    while True:
        extra = [
            t
            for t in threading.enumerate()
            if t.ident not in before and t.is_alive() and not t.name.startswith("asyncio_")
        ]
        if not extra or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert not extra, f"threads left behind: {[t.name for t in extra]}"
