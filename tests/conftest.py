"""Fixtures shared by the whole suite: small test clips, config files, free endpoints.

The checkout goes first on sys.path: pytest puts this file's folder (tests/) there, and
without it `import stages` would find the namespace folder tests/stages instead of the
package. tests/pipeline/ follows, so configs in any test can name the helper stages of
tests/pipeline/engine_stages.py as `kind = "engine_stages:Collect"`.

Each pytest process (one per xdist worker, docs/architecture.md "Testing") gets its own
simulated-device context table: the table is machine-wide by design (npu/sim.py,
ContextRegistry), so workers sharing it would see each other's contexts and hit the 16-context
limit together. The directory is set in the environment before any test opens a SimDevice,
so the `npucam` processes the tests start inherit it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
import textwrap
from pathlib import Path

# as the npucam command does (pipeline/cli.py): one BLAS thread per calling thread, set
# before numpy loads, so in-process runs behave as the command runs; and one OpenMP thread
# for torch, the references' (test extra): with 4 workers on 2 cores, their spinning threads
# slowed every worker
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

_HWCTX_DIR = tempfile.mkdtemp(
    prefix=f"npucam-sim-hwctx-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"
)
os.environ["NPUCAM_SIM_HWCTX_DIR"] = _HWCTX_DIR  # npu.sim.REGISTRY_ENV, before npu loads
atexit.register(shutil.rmtree, _HWCTX_DIR, ignore_errors=True)

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "pipeline"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def numbered_frame(i: int, width: int = 64, height: int = 48) -> np.ndarray:
    """uint8 [height, width, 3] BGR: a flat grey level of 8 * (i % 32), so frames differ."""
    return np.full((height, width, 3), 8 * (i % 32), np.uint8)


@pytest.fixture
def make_clip(tmp_path):
    """make_clip(name, frames, fps, size=(w, h)) -> path of a small MJPG .avi in tmp_path."""

    def make(name: str = "clip.avi", frames: int = 20, fps: float = 20.0, size=(64, 48)) -> Path:
        path = tmp_path / name
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, size)
        assert writer.isOpened(), "OpenCV cannot write MJPG .avi here"
        for i in range(frames):
            writer.write(numbered_frame(i, *size))
        writer.release()
        return path

    return make


@pytest.fixture
def write_config(tmp_path):
    """write_config(text, name="pipeline.toml") -> path of a dedented TOML file in tmp_path."""

    def write(text: str, name: str = "pipeline.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


# Tests marked `heavy` run a whole pipeline (models, threads, subprocesses) for seconds: each
# takes a core or more, so four at once on 2 cores doubled each one's time. They share one
# xdist group (Makefile: --dist loadgroup), so one runs at a time and the light tests fill the
# other workers.
def pytest_itemcollected(item) -> None:
    """A heavy test joins the `heavy` group as it is collected (xdist's workers read the
    groups in their own collection_modifyitems, which runs before a conftest's)."""
    if item.get_closest_marker("heavy"):
        item.add_marker(pytest.mark.xdist_group("heavy"))


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for subprocess configs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo_config(tmp_path, free_port) -> tuple[Path, str]:
    """configs/demo.toml as shipped, publishing on its own free port: (path, endpoint). Its
    relative bundle and gallery paths find nothing from tmp_path, as on a fresh clone, so it
    runs the synthetic models."""
    endpoint = f"tcp://127.0.0.1:{free_port}"
    text = (Path(__file__).resolve().parents[1] / "configs" / "demo.toml").read_text()
    bind = 'bind = "tcp://127.0.0.1:5560"'
    assert text.count(bind) == 1, "configs/demo.toml no longer binds 5560 once"
    path = tmp_path / "demo.toml"
    path.write_text(text.replace(bind, f'bind = "{endpoint}"'))
    return path, endpoint
