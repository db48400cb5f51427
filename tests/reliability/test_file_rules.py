"""The files a run reads besides its config: CLIP's labels file and the face gallery (issue
18, findings 9 and 10). Both go through pipeline.files.read_regular: a regular file only, no
symlink as the last component, a non-blocking open (a FIFO cannot hang the reader), and a
size cap. `validate` and `run` refuse what the stage could never read, naming the file and
the key; a file swapped for a FIFO while the pipeline runs keeps the previous contents.

9. labels_file used to follow a symlink to a 0600 file and publish its lines as labels; a
   gallery replaced by a FIFO silently stopped face/ and hung shutdown.
10. validate passed a gallery of /dev/zero (unbounded RSS at run), a FIFO (startup hung) and
   `bundle = "/etc"` (infer died).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import ConfigError, load_config, parse_config
from pipeline.graph import Context, Pipeline, load
from pipeline.messages import now_ns
from pipeline.metrics import Metrics
from stages.gallery import Gallery, GalleryError, GalleryFile, read_gallery, write_gallery
from stages.models.adaface.job import FaceInferred, FaceJob
from stages.models.adaface.post import FaceMatch, FaceMatchOptions
from stages.models.clip.runtime import LabelsFileError, read_labels_file

WAIT_S = 5.0  # a read that takes longer than this is hanging


def within(fn, what: str):
    """fn() on a daemon thread, failing the test if it has not returned after WAIT_S (the
    old code blocked forever opening a FIFO)."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(WAIT_S)
    if t.is_alive():
        pytest.fail(f"{what} still blocked after {WAIT_S} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def release(path: Path) -> None:
    """Open and close the FIFO at path for writing, so a reader stuck opening it returns."""
    with contextlib.suppress(OSError):  # ENXIO: no reader waiting, nothing is stuck
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def fifo(tmp_path):
    """A FIFO, released at teardown (a reader stuck on it, as the old code was, returns)."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield path
    release(path)


def gallery(names=("alice",)) -> Gallery:
    rng = np.random.default_rng(1)
    g = Gallery.empty(512, "IR:test")
    for n in names:
        v = rng.normal(size=512).astype(np.float32)
        g = g.add(n, v / np.linalg.norm(v))
    return g


# ---- finding 9: labels and gallery files at run time ---------------------------------------


def test_a_labels_file_that_is_a_symlink_to_a_private_file_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("api-key-123\nhunter2\n")
    secret.chmod(0o600)
    link = tmp_path / "labels.txt"
    link.symlink_to(secret)
    with pytest.raises(
        LabelsFileError, match=r"labels\.txt: cannot read the labels file: is a symlink"
    ):
        read_labels_file(link)
    path = tmp_path / "run.toml"
    path.write_text(
        '[[stages]]\nkind = "infer"\nbackend = "cpu"\n'
        '[stages.clip]\nenabled = true\nsynthetic = true\nlabels_file = "labels.txt"\n'
    )
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert "stages[0].clip.labels_file" in str(err.value) and "symlink" in str(err.value)
    assert "hunter2" not in str(err.value)


def test_a_labels_file_that_is_a_fifo_is_refused_without_blocking(fifo):
    with pytest.raises(LabelsFileError, match="FIFO"):
        within(lambda: read_labels_file(fifo), "reading a FIFO as the labels file")


def test_a_gallery_replaced_by_a_fifo_keeps_the_previous_gallery_and_face_goes_on(tmp_path):
    path = tmp_path / "gallery.npz"
    write_gallery(path, gallery())
    config = parse_config({"stages": [{"kind": "capture"}]}, tmp_path / "run.toml")
    stage = FaceMatch("face", FaceMatchOptions(gallery="gallery.npz", reload_interval_s=0),
                      Context(config, Metrics()))  # fmt: skip
    alice = gallery().embeddings[0]
    path.unlink()
    os.mkfifo(path)
    try:
        (result,) = within(lambda: stage.process(face_item(alice)), "face_match on a FIFO")
        assert result.identity == "alice"  # the previous gallery, still in use
        assert "FIFO" in str(stage.gallery.last_error)
    finally:
        release(path)


def test_a_gallery_over_its_size_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "gallery.npz"
    write_gallery(path, gallery(names=[f"p{i}" for i in range(8)]))  # 8 x 2 KiB rows
    with pytest.raises(GalleryError, match=r"bytes, over the 4096-byte limit"):
        read_gallery(path, max_bytes=4096)
    store = GalleryFile(tmp_path / "none.npz", max_bytes=4096)
    assert store.current.names == ()


# ---- finding 10: validate and run refuse what the stage could never read -------------------


def face_match_config(tmp_path: Path, gallery_path: str, extra: str = "") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n'
        '[[stages]]\nkind = "capture"\nto = ["face_match"]\n'
        f'[[stages]]\nkind = "face_match"\ngallery = "{gallery_path}"\n{extra}'
    )
    return path


@pytest.mark.parametrize(
    ("gallery_path", "problem"),
    [
        ("/dev/zero", "is a character device, not a regular file"),
        ("FIFO", "is a FIFO (named pipe), not a regular file"),
        (".", "is a directory, not a regular file"),
        ("notes.txt", "not a readable face gallery (.npz): no zip header"),
        ("link.npz", "is a symlink"),
    ],
)
def test_validate_and_run_refuse_a_gallery_that_is_not_a_regular_gallery_file(
    tmp_path, fifo, gallery_path, problem
):
    (tmp_path / "notes.txt").write_text("alice\nbob\n")
    write_gallery(tmp_path / "real.npz", gallery())
    (tmp_path / "link.npz").symlink_to(tmp_path / "real.npz")
    gallery_path = str(fifo) if gallery_path == "FIFO" else gallery_path
    path = face_match_config(tmp_path, gallery_path)
    with pytest.raises(ConfigError) as err:
        within(lambda: load(str(path)), "validate")
    assert f"{path}: stages[1].gallery: " in str(err.value), str(err.value)
    assert problem in str(err.value)
    with pytest.raises(ConfigError, match=r"stages\[1\]\.gallery"):  # run checks the same
        within(lambda: Pipeline(load_config(path)), "run's start")


def test_validate_names_the_gallery_size_cap_key(tmp_path):
    write_gallery(tmp_path / "g.npz", gallery(names=[f"p{i}" for i in range(8)]))
    path = face_match_config(tmp_path, "g.npz", "gallery_max_bytes = 4096\n")
    with pytest.raises(ConfigError, match=r"stages\[1\]\.gallery: .*over the 4096-byte limit"):
        load(str(path))


@pytest.mark.parametrize("bundle", ["/etc", "empty", "a-file"])
def test_validate_refuses_a_bundle_folder_infer_could_not_open(tmp_path, bundle):
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    path = tmp_path / "run.toml"
    path.write_text(
        f'[[stages]]\nkind = "infer"\nbackend = "sim"\n'
        f'[stages.adaface]\nenabled = true\nsynthetic = true\nbundle = "{bundle}"\n'
    )
    with pytest.raises(ConfigError, match=r"stages\[0\]\.adaface\.bundle: ") as err:
        load(str(path))
    assert ("not a bundle directory" in str(err.value)) == (bundle == "a-file")
    if bundle != "a-file":
        assert "not a usable bundle" in str(err.value) and "manifest.txt" in str(err.value)


def face_item(embedding: np.ndarray) -> FaceInferred:
    t = now_ns()
    job = FaceJob(
        camera="cam",
        seq=1,
        capture_ts_ns=t,
        deadline_ns=t + 10**10,
        box_xywh=np.array([5, 6, 20, 24], np.float32),
        score=0.8,
        landmarks=np.arange(10, dtype=np.float32).reshape(5, 2),
        track_id=2,
        landmark_source="yunet",
    )
    return FaceInferred(job=job, output=embedding, backend="sim", model="IR:test", synthetic=False)
