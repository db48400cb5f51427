"""The `npucam` entry point: a reader that goes away (`npucam bundle info DIR | head`) ends any
command quietly with exit 0, instead of a BrokenPipeError traceback (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_into_a_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    """Run `python -m pipeline ARGS` with stdout a pipe whose reader has already gone, so
    every write to it fails with EPIPE (as once `head` has exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "pipeline", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [
        ["bundle", "info", "SYNTHETIC_BUNDLE"],
        ["validate", "configs/multicam-pose.toml"],
        ["--help"],
    ],
)
def test_a_reader_that_went_away_ends_the_command_quietly(args):
    from npu.models.synthetic import bundle_path

    args = [str(bundle_path("sapiens2")) if a == "SYNTHETIC_BUNDLE" else a for a in args]
    done = run_into_a_closed_pipe(args)
    assert done.returncode == 0, done.stderr
    assert "BrokenPipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr
