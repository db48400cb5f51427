"""A gallery whose `meta` JSON is hostile (issue 33, low finding): meta nested 100000 deep or
holding a 5000-digit integer escaped GalleryError (json raised RecursionError and ValueError,
and `npucam validate` printed a traceback). Now meta is bounded before it is parsed
(stages/gallery.py META_LIMITS, pipeline/bounded_json.py): GalleryError naming the file, and
`validate` reports it on the config's gallery key.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from stages.gallery import GalleryError, read_gallery


def hostile_gallery(path: Path, meta: bytes) -> None:
    emb = np.zeros((1, 4), np.float32)
    emb[0, 0] = 1.0
    buf = io.BytesIO()
    np.savez(
        buf,
        names=np.array(["alice"]),
        embeddings=emb,
        meta=np.frombuffer(meta, np.uint8),
    )
    path.write_bytes(buf.getvalue())


HOSTILE = {
    "100000 deep": b'{"format": "npucam-face-gallery", "x": '
    + b"[" * 100_000
    + b"]" * 100_000
    + b"}",
    "5000-digit version": b'{"format": "npucam-face-gallery", "version": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_gallery_meta_is_a_gallery_error_naming_the_file(tmp_path, name):
    path = tmp_path / "g.npz"
    hostile_gallery(path, HOSTILE[name])
    with pytest.raises(GalleryError, match=rf"{path}: field 'meta' is not JSON within its limits"):
        read_gallery(path)


@pytest.mark.parametrize("name", HOSTILE)
def test_validate_reports_a_hostile_gallery_meta_without_a_traceback(tmp_path, capsys, name):
    hostile_gallery(tmp_path / "g.npz", HOSTILE[name])
    config = tmp_path / "run.toml"
    config.write_text(
        '[[cameras]]\nname = "a"\nurl = "synthetic:"\n'
        '[[stages]]\nkind = "capture"\nto = ["face_match"]\n'
        '[[stages]]\nkind = "face_match"\ngallery = "g.npz"\n'
    )
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}: stages[1].gallery: " in err and "within its limits" in err
    assert "Traceback" not in err
