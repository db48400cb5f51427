"""bench/pose2sim_reference.py run in the Pose2Sim reference venv (.venv-pose2sim, `make
setup-test`): how the rig tests reach Pose2Sim's own code, which npucam never imports."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REFERENCE_PYTHON = ROOT / ".venv-pose2sim" / "bin" / "python"
REFERENCE_SCRIPT = ROOT / "bench" / "pose2sim_reference.py"


def run_reference(*args: str | Path, cwd: Path) -> None:
    """The reference script with args, in cwd; fails the test with its stderr if it fails,
    and names the missing venv if it is not set up."""
    if not REFERENCE_PYTHON.is_file():
        raise RuntimeError(
            f"{REFERENCE_PYTHON}: the Pose2Sim reference venv is missing; run `make setup-test`"
        )
    cmd = [str(REFERENCE_PYTHON), str(REFERENCE_SCRIPT), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
