from __future__ import annotations

import io
import os
from collections import OrderedDict

import numpy as np
import pytest
import torch

from stages.body.torch_zip import TorchZipError, load_torch_zip


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_tensors_dicts_and_lists_read_as_torch_load_reads_them():
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    obj = OrderedDict(
        a=base,
        t=base.T,  # a strided view sharing a's storage
        s=base[1:, 2:5],  # an offset into it
        f=torch.randn(3, 5, dtype=torch.float32),
        i=torch.tensor([3, -1, 7]),
        labels=["x", "y"],
        scalar=0.5,
    )
    got = load_torch_zip(_saved(obj), "obj.pth")
    want = torch.load(io.BytesIO(_saved(obj)), weights_only=True)
    assert list(got) == list(want)
    for key in ("a", "t", "s", "f", "i"):
        assert got[key].dtype == want[key].numpy().dtype
        np.testing.assert_array_equal(got[key], want[key].numpy())
    assert got["labels"] == ["x", "y"] and got["scalar"] == 0.5


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch SHOULD_NOT_EXIST",))


def test_a_pickled_callable_is_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = _saved({"x": torch.zeros(2), "evil": _Payload()})
    with pytest.raises(TorchZipError, match=r"evil.pth: refusing pickled global .*system"):
        load_torch_zip(data, "evil.pth")
    assert not (tmp_path / "SHOULD_NOT_EXIST").exists()


def test_not_a_zip_names_the_file():
    with pytest.raises(TorchZipError, match="junk.pth: not a torch zip"):
        load_torch_zip(b"not a zip", "junk.pth")
