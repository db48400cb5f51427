"""The pacing an end-to-end test runs a shipped config's simulated NPU at: "none" in the default
run (passes as fast as numpy computes them, so a test checks what is published and how, in
seconds), and the config's own "npu2" in a slow variant of the same test (docs/device.md §6).
NPU2's pace itself is tested where it is computed: tests/npu/test_sim*.py, tests/stages/."""

from __future__ import annotations

from pathlib import Path

import pytest

PACED = 'pacing = "npu2"'

# parametrize("pacing", PACINGS): the test runs unpaced by default, as shipped under -m slow
PACINGS = ["none", pytest.param("npu2", marks=pytest.mark.slow)]


def set_pacing(config: Path, pacing: str) -> Path:
    """Rewrite a config copy's `pacing = "npu2"` lines to `pacing`; it must have one."""
    text = config.read_text()
    assert PACED in text, f"{config}: no {PACED} line to rewrite"
    config.write_text(text.replace(PACED, f'pacing = "{pacing}"'))
    return config
