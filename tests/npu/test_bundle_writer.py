"""npu.bundle_writer: what it writes reads back through npu.bundle unchanged, in the on-disk
form docs/bundles.md gives (64-byte aligned offsets, one record a line)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu.bf16 import pack_bfp16, round_bf16, unpack_bfp16
from npu.bundle import Bundle, BundleError
from npu.bundle_writer import BundleWriter


def test_round_trip_of_records_params_xclbins_files_and_every_dtype(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 64)).astype(np.float32)
    f = rng.standard_normal((3, 5)).astype(np.float32)
    packed = pack_bfp16(w, 64, 512, 128)
    with BundleWriter(tmp_path / "b", version=1) as wr:
        wr.comment("written by the test")
        wr.param("name", "IR 18")
        wr.param("sizes", [1, 2, 3])
        wr.param("eps", 1e-5)
        wr.xclbin("ctx0", "kernels/gemm.xclbin", data=b"XCLBIN")
        wr.file("kernels/g0.bin", np.arange(4, dtype=np.uint32).tobytes())
        wr.record(
            "gemm",
            "g0",
            ctx="ctx0",
            insts="kernels/g0.bin",
            M=256,
            K=512,
            N=64,
            tile_k=512,
            tile_n=64,
            ct_k=128,
            bias=True,
            b_bytes=packed.size,
        )
        wr.record("case", 0, "cases/cats.jpg", tail="Two  dogs, playing!")
        offsets = [
            wr.tensor("f", f),
            wr.tensor("g0.b", packed),
            wr.tensor("h", f, dtype="bf16"),
            wr.tensor("i", np.arange(7, dtype=np.int32)),
            wr.tensor("s", np.float32(2.5)),
            wr.tensor("raw", b"\x01\x02\x03"),
            wr.tensor("m", f.astype(ml_dtypes.bfloat16)),
        ]
    assert all(o % 64 == 0 for o in offsets) and offsets == sorted(offsets)
    b = Bundle.open(tmp_path / "b", version=1)
    assert b.param("name") == "IR 18" and b.param_list("sizes") == [1, 2, 3]
    assert b.param("eps", float) == 1e-5
    assert b.xclbin("ctx0").path.read_bytes() == b"XCLBIN"
    g = next(b.tagged("gemm"))
    assert g.flag("bias") and g.get("b_bytes") == 512 * 64 // 8 * 9
    assert np.frombuffer(g.path("insts").read_bytes(), np.uint32).tolist() == [0, 1, 2, 3]
    assert next(b.tagged("case")).rest(2) == "Two  dogs, playing!"
    np.testing.assert_array_equal(b.array("f", "f32"), f)
    np.testing.assert_array_equal(b.f32("h"), round_bf16(f))
    np.testing.assert_array_equal(b.f32("m"), round_bf16(f))
    np.testing.assert_array_equal(b.view("i", "i32"), np.arange(7))
    assert b.entry("s").shape == (1,) and b.view("s")[0] == 2.5
    assert b.view("raw", "u8").tolist() == [1, 2, 3]
    blob = b.view(g.field(0) + ".b", "u8")
    assert blob.size == g.get("b_bytes")
    np.testing.assert_array_equal(
        unpack_bfp16(blob, 512, 64, g.get("tile_n"), g.get("tile_k"), g.get("ct_k")),
        unpack_bfp16(packed, 512, 64, 64, 512, 128),
    )


def test_on_disk_form(tmp_path):
    with BundleWriter(tmp_path / "b", version=3) as wr:
        wr.param("p", 7)
        wr.record("op", "k", x=1)
        wr.tensor("a", np.float32([1.0, 2.0]))
        wr.tensor("b", np.float32([[1.0, 2.0]]), dtype="bf16")
    assert (tmp_path / "b" / "manifest.txt").read_text() == "version 3\nparam p 7\nop k x=1\n"
    assert (tmp_path / "b" / "tensors.txt").read_text() == "a f32 2 0 8\nb bf16 1,2 64 4\n"
    blob = (tmp_path / "b" / "tensors.bin").read_bytes()
    assert len(blob) == 68 and blob[8:64] == bytes(56) and blob[64:] == bytes([0x80, 0x3F, 0, 0x40])


@pytest.mark.parametrize(
    "call",
    [
        lambda w: w.record("two words", "x"),
        lambda w: w.record("#c", "x"),
        lambda w: w.record("param", "x"),
        lambda w: w.record("op", "a b"),
        lambda w: w.record("op", k="a b"),
        lambda w: w.record("op", tail=" leading space"),
        lambda w: w.param("p", ""),
        lambda w: w.param("p", "a\nb"),
        lambda w: w.param("bad name", 1),
        lambda w: w.comment("a\nb"),
        lambda w: w.file("../escape.bin", b""),
        lambda w: w.file("/abs.bin", b""),
        lambda w: w.xclbin("c", "../x.xclbin", data=b""),
        lambda w: w.tensor("t t", np.zeros(1, np.float32)),
        lambda w: w.tensor("t", np.zeros(1, np.float64)),
        lambda w: w.tensor("t", np.zeros(1, np.float32), dtype="f16"),
    ],
)
def test_writer_refuses_what_would_not_read_back(tmp_path, call):
    with BundleWriter(tmp_path / "b", version=1) as wr, pytest.raises(BundleError):
        call(wr)


def test_writer_refuses_duplicate_tensors_and_an_existing_bundle(tmp_path):
    with BundleWriter(tmp_path / "b", version=1) as wr:
        wr.tensor("t", np.zeros(2, np.float32))
        with pytest.raises(BundleError, match="tensor t written twice"):
            wr.tensor("t", np.zeros(2, np.float32))
    with pytest.raises(BundleError, match="already holds a bundle"):
        BundleWriter(tmp_path / "b", version=1)


WS = set(" \t\n\x0b\x0c\r\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}
TOKEN = st.text(
    st.characters(blacklist_characters=sorted(WS), blacklist_categories=["Cs"]),
    min_size=1,
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(
    tag=TOKEN.filter(lambda t: not t.startswith("#") and t not in ("version", "param", "xclbin")),
    fields=st.lists(TOKEN.filter(lambda t: "=" not in t), max_size=4),
    # keys other than record()'s own keyword parameters (hypothesis found `tag`)
    kv=st.dictionaries(
        TOKEN.filter(lambda t: "=" not in t and t not in ("tag", "tail")), TOKEN, max_size=4
    ),
    tail=st.none()
    | st.text(
        st.characters(blacklist_characters=["\n", "\r"], blacklist_categories=["Cs"]), max_size=20
    ).filter(lambda t: t == "" or t[0] not in WS),
    param=TOKEN,
)
def test_any_record_and_param_the_writer_accepts_reads_back(tag, fields, kv, tail, param):
    with tempfile.TemporaryDirectory() as d:
        with BundleWriter(Path(d) / "b", version=1) as w:
            w.record(tag, *fields, tail=tail, **kv)
            w.param("p", param + " and more")
        b = Bundle.open(Path(d) / "b", version=1)
        (r,) = b.records
        assert r.tag == tag and r.fields[: len(fields)] == fields
        for k, v in kv.items():
            assert r.value(k) == v
        if tail:
            assert r.rest(len(fields) + len(kv)) == tail
        assert b.param("p") == param + " and more"
