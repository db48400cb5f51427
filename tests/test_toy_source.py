"""A camera source plugs in with one registry entry and no edit to npucam: the toy `npy:` kind
(tests/toysource) is read by the camera reader at the camera's fps, runs capture -> publish,
is checked by `validate` and probed by `npucam plan` at its configured rate; installed as an
npucam.sources entry point, the `npucam` command finds it in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from engine_stages import run_and_receive

from pipeline import wire
from pipeline.cli import main
from pipeline.clock import VirtualClock
from stages.source_kinds import registry
from stages.sources import CameraReader, CameraSpec, SourceError
from tests.toysource import KIND, NpyKind

REPO = Path(__file__).resolve().parents[1]
N, H, W = 12, 24, 32
FPS = 12.5  # neither the planner's assumed 10 fps nor a rate a read could happen to measure


@pytest.fixture
def npy_registered():
    registry.register(KIND)
    yield
    registry.unregister(KIND.name)


def toy_frames() -> np.ndarray:
    """uint8 [N, H, W, 3]: frame i is level 20 * i in blue, a gradient in green and red."""
    frames = np.empty((N, H, W, 3), np.uint8)
    frames[..., 0] = (20 * np.arange(N))[:, None, None]
    frames[..., 1] = np.arange(W)[None, None, :]
    frames[..., 2] = np.arange(H)[None, :, None]
    return frames


def camera_toml(url: str, fps: float | None = FPS) -> str:
    rate = "" if fps is None else f"fps = {fps}\n"
    return f'[[cameras]]\nname = "toy"\nurl = "{url}"\n{rate}staleness_ms = 60000\n'


def test_the_npy_scheme_is_unknown_until_its_kind_is_registered(tmp_path):
    with pytest.raises(SourceError, match="unknown source scheme 'npy'"):
        CameraSpec("toy", "npy:frames.npy", base_dir=tmp_path)
    registry.register(KIND)
    try:
        spec = CameraSpec("toy", "npy:frames.npy", base_dir=tmp_path)
        assert (spec.kind, spec.live, spec.path) == ("npy", False, tmp_path / "frames.npy")
        with pytest.raises(SourceError, match=r"camera 'toy' \(npy:\): npy needs a file"):
            CameraSpec("toy", "npy:")
        with pytest.raises(SourceError, match=r"file path, .* synthetic:, recording: or npy:$"):
            CameraSpec("toy", "ftp://host/a.mp4")
    finally:
        registry.unregister(KIND.name)


def test_a_second_kind_cannot_take_a_scheme_that_is_registered(npy_registered):
    class Other(NpyKind):
        name = "other"

    with pytest.raises(ValueError, match="source kind 'other': scheme 'npy' belongs to 'npy'"):
        registry.register(Other())
    registry.register(KIND)  # the same kind again is no change


def test_the_reader_paces_npy_frames_at_the_camera_fps_on_a_virtual_clock(npy_registered, tmp_path):
    frames = toy_frames()
    np.save(tmp_path / "frames.npy", frames)
    spec = CameraSpec("toy", "npy:frames.npy", base_dir=tmp_path, fps=FPS)
    clock = VirtualClock()
    got = []
    reader = CameraReader(spec, got.append, clock)
    reader.start()
    end = time.monotonic() + 10  # a hang guard only: the virtual clock never waits
    while reader.health != "ended" and time.monotonic() < end:
        time.sleep(0.01)
    reader.stop()
    assert reader.health == "ended" and reader.stats()["frames"] == N
    assert [f.seq for f in got] == list(range(N))
    for i, f in enumerate(got):
        np.testing.assert_array_equal(f.image, frames[i])
        assert f.source == f"npy:{tmp_path / 'frames.npy'}#{i}"
    gaps = np.diff([f.capture_ts_ns for f in got])
    np.testing.assert_allclose(gaps, 1e9 / FPS, atol=2)  # ns rounding of the stamps
    assert clock.waits and all(w == pytest.approx(1 / FPS) for w in clock.waits)


def test_npy_frames_run_through_capture_and_publish_in_order(
    npy_registered, write_config, tmp_path
):
    np.save(tmp_path / "frames.npy", toy_frames())
    path = write_config(
        "[metrics]\nstats_interval_s = 0.5\n"
        + camera_toml("npy:frames.npy")
        + """
        [[stages]]
        kind = "capture"
        [[stages]]
        kind = "publish"
        bind = "tcp://127.0.0.1:*"
        wait_for_subscribers = 1
        inbox = { size = 4, policy = "block" }
        """.replace("\n        ", "\n")
    )

    _, code, raw = run_and_receive(path, duration=30, until_idle_s=2.0)
    messages = [wire.decode(m) for m in raw]
    assert code == 0
    det = [m.header for m in messages if m.topic == "det/toy"]
    assert [h["seq"] for h in det] == list(range(N))  # every frame, in order, none dropped
    assert {(h["width"], h["height"]) for h in det} == {(W, H)}
    final = [m.header for m in messages if m.topic == "stats"][-1]["stats"]
    assert final["stages"]["publish"]["out"] == {"toy": N}
    assert final["cameras"]["toy"]["frames"] == N and final["cameras"]["toy"]["health"] == "ended"


def test_validate_names_the_camera_and_its_missing_or_malformed_npy_file(
    npy_registered, write_config, tmp_path, capsys
):
    path = write_config(camera_toml("npy:frames.npy") + '[[stages]]\nkind = "capture"\n')
    assert main(["validate", str(path)]) == 2
    missing = tmp_path / "frames.npy"
    expected = f"{path}: cameras[0].url: camera 'toy' (npy:frames.npy): file not found: {missing}"
    assert expected in capsys.readouterr().err
    np.save(missing, toy_frames()[..., 0])  # [N, H, W]: no colour axis
    assert main(["validate", str(path)]) == 2
    assert f"expected uint8 [N, H, W, 3] with N >= 1, got uint8 {(N, H, W)}" in (
        capsys.readouterr().err
    )
    np.save(missing, toy_frames())
    assert main(["validate", str(path)]) == 0


def test_plan_probes_the_npy_camera_at_its_configured_fps(npy_registered, tmp_path, capsys):
    np.save(tmp_path / "frames.npy", toy_frames())
    path = tmp_path / "plan.toml"
    detect = '[[stages]]\nkind = "detect"\nperson = "none"\nface = "none"\npose = false\n'
    path.write_text(camera_toml("npy:frames.npy") + '[[stages]]\nkind = "capture"\n' + detect)
    assert main(["plan", str(path), "--frames", "4", "--json"]) == 0
    (camera,) = json.loads(capsys.readouterr().out)["cameras"]
    assert (camera["kind"], camera["fps"], camera["fps_source"]) == ("npy", FPS, "configured")
    assert camera["size"] == [W, H]
    assert main(["plan", str(path), "--frames", "4"]) == 0
    assert f"toy: npy, {FPS:.2f} fps (configured), {W}x{H}" in capsys.readouterr().out


def test_an_installed_npy_plugin_reaches_the_npucam_command(tmp_path, write_config):
    # a distribution on the path whose npucam.sources entry point names the toy kind, as
    # `pip install` of a plugin package would leave it; no register() call in that process
    dist = tmp_path / "site" / "npucam_toysource-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: npucam-toysource\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[npucam.sources]\nnpy = tests.toysource:KIND\n")
    path = write_config(camera_toml("npy:frames.npy") + '[[stages]]\nkind = "capture"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    run = subprocess.run(
        [sys.executable, "-m", "pipeline", "validate", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert run.returncode == 2
    assert "cameras[0].url: camera 'toy' (npy:frames.npy): file not found" in run.stderr
