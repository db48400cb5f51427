"""npu.bundle: manifest grammar, reserved records, tensors, every error text of docs/bundles.md
"Errors" (taconite-bundle/src/lib.rs's wording), path confinement and arbitrary-bytes fuzzing."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu.bundle import Bundle, BundleError, Record, rust_lines
from pipeline.errors import NpucamError

# The fixture bundle of taconite-bundle's tests: a is f32 [2] at 0, b is bf16 1,2 at 64.
TENSORS_TXT = "a f32 2 0 8\nb bf16 1,2 64 4\n"
TENSORS_BIN = np.float32([3.5, -1.0]).tobytes() + bytes(56) + bytes([0x80, 0x3F, 0x00, 0x40])


def make(
    root: Path, manifest: str | bytes, tensors: str | bytes = TENSORS_TXT, blob: bytes = TENSORS_BIN
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in (("manifest.txt", manifest), ("tensors.txt", tensors)):
        (root / name).write_bytes(data.encode() if isinstance(data, str) else data)
    (root / "tensors.bin").write_bytes(blob)
    return root


def open_manifest(tmp_path: Path, text: str, version: int | None = 3) -> Bundle:
    return Bundle.open(make(tmp_path / "b", text), version=version)


def error_of(
    tmp_path: Path,
    manifest: str,
    tensors: str = TENSORS_TXT,
    blob: bytes = TENSORS_BIN,
    version: int | None = 3,
) -> str:
    root = make(tmp_path / "b", manifest, tensors, blob)
    with pytest.raises(BundleError) as err:
        Bundle.open(root, version=version)
    return str(err.value)


GOOD = (
    "# a comment line\n"
    "version 3\n"
    "\n"
    "param name IR 18\n"
    "param sizes 1,2,,3\n"
    "param scale 0.5\n"
    "param empty_list ,\n"
    "xclbin ctx0 kernels/a.xclbin MLIR_AIE extra\n"
    "gemm g0 ctx=ctx0 M=256 bias=1 a=b=c a=last #not-a-comment\n"
    "case 0 cases/cats.jpg Two  dogs, playing!\n"
)


def test_reads_records_params_xclbins_and_tensors(tmp_path):
    b = open_manifest(tmp_path, GOOD)
    assert b.version == 3
    assert [r.tag for r in b.records] == ["gemm", "case"]
    g = next(b.tagged("gemm"))
    assert g.line == 9
    assert g.fields == ["g0", "ctx=ctx0", "M=256", "bias=1", "a=b=c", "a=last", "#not-a-comment"]
    assert g.get("M") == 256 and g.flag("bias") is True and g.value("a") == "last"
    assert g.field(0) == "g0" and g.has("ctx") and not g.has("N")
    assert b.xclbin(g.value("ctx")).kernel == "MLIR_AIE"
    assert b.xclbin("ctx0").path == (tmp_path / "b" / "kernels" / "a.xclbin").resolve()
    assert b.param("name") == "IR 18"
    assert b.param_list("sizes") == [1, 2, 3]
    assert b.param_list("empty_list") == []
    assert b.param("scale", float) == 0.5
    assert next(b.tagged("case")).rest(2) == "Two  dogs, playing!"
    np.testing.assert_array_equal(b.view("a", "f32"), [3.5, -1.0])
    np.testing.assert_array_equal(b.f32("b"), [[1.0, 2.0]])
    assert b.view("b").dtype == np.uint16 and b.entry("b").offset == 64
    assert b.tensors_bytes == 12


def test_key_split_at_first_equals_and_last_key_wins(tmp_path):
    r = Record.parse(1, "op k a=b=c x=1 x=2 =v", tmp_path)
    assert r.kv == {"a": "b=c", "x": "2", "": "v"}


def test_lines_follow_rust_str_lines():
    assert rust_lines("a\r\nb\n") == ["a", "b"]
    assert rust_lines("a\n\nb") == ["a", "", "b"]
    assert rust_lines("a\rb\r") == ["a\rb\r"]
    assert rust_lines("") == [] and rust_lines("\n") == [""]


def test_crlf_manifest_and_line_numbers_count_blank_and_comment_lines(tmp_path):
    text = "version 3\r\n\r\n# c\r\nop k x=1\r\nop k x=\r\n"
    b = open_manifest(tmp_path, text)
    r = b.records[1]
    assert r.line == 5 and r.text == "op k x="
    with pytest.raises(BundleError, match=r"^manifest.txt:5: `x=` is malformed, in: op k x=$"):
        r.get("x")


def test_whitespace_is_rusts_not_pythons(tmp_path):
    # U+001F is whitespace to Python's str.split but not to Rust's split_whitespace.
    r = Record.parse(1, "op a\x1fb\u3000c", tmp_path)
    assert r.fields == ["a\x1fb", "c"]


def test_rest_keeps_inner_spacing_and_strips_one_space(tmp_path):
    r = Record.parse(1, "tok_test 3   a  b ", tmp_path)
    assert r.rest(1) == "  a  b "
    assert r.rest(0) == "3   a  b "
    assert r.rest(5) == ""


def test_integers_parse_as_rust(tmp_path):
    r = Record.parse(7, "op k a=+5 b=1_0 c= d=-1 e=18446744073709551616 f=1e3 g=.5", tmp_path)
    assert r.get("a") == 5
    for key, v in (("b", "1_0"), ("c", ""), ("d", "-1"), ("e", "18446744073709551616")):
        with pytest.raises(BundleError) as err:
            r.get(key)
        assert str(err.value) == f"manifest.txt:7: `{key}={v}` is malformed, in: {r.text}"
    assert r.get("f", float) == 1000.0 and r.get("g", float) == 0.5
    assert r.get("b", str) == "1_0"


def test_version_with_plus_sign_leading_zeros_and_u32_limit(tmp_path):
    assert open_manifest(tmp_path / "x", "version +3\n").version == 3
    assert open_manifest(tmp_path / "y", "version " + "0" * 5000 + "3\n").version == 3
    long = "9" * 5000
    assert error_of(tmp_path, f"version {long}\n") == (
        f"manifest.txt:1: field 1 ({long}) is malformed, in: version {long}"
    )
    msg = error_of(tmp_path, "version 4294967296\n", version=None)
    assert msg == "manifest.txt:1: field 1 (4294967296) is malformed, in: version 4294967296"


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("version 3\nversion 3\n", "manifest.txt:2: second version record, in: version 3"),
        ("version x3\n", "manifest.txt:1: field 1 (x3) is malformed, in: version x3"),
        ("version 1_0\n", "manifest.txt:1: field 1 (1_0) is malformed, in: version 1_0"),
        ("version\n", "manifest.txt:1: expected at least 1 fields, in: version"),
        ("version 3\nparam k\n", "manifest.txt:2: expected at least 2 fields, in: param k"),
        ("version 3\nparam\n", "manifest.txt:2: expected at least 1 fields, in: param"),
        (
            "param k 1\nparam k 2\nversion 3\n",
            "manifest.txt:2: param k defined twice, in: param k 2",
        ),
        (
            "version 3\nxclbin c a.xclbin\n",
            "manifest.txt:2: expected at least 3 fields, in: xclbin c a.xclbin",
        ),
        (
            "version 3\nxclbin c a.xclbin K\n  xclbin c b.xclbin K\n",
            "manifest.txt:3: xclbin c defined twice, in:   xclbin c b.xclbin K",
        ),
    ],
)
def test_manifest_record_errors(tmp_path, manifest, message):
    assert error_of(tmp_path, manifest) == message


def test_version_mismatch_and_missing_version_name_both_versions(tmp_path):
    root = tmp_path / "b"
    assert error_of(tmp_path, "version 1\n") == (
        f"{root}/manifest.txt: version 1, this runtime reads version 3; re-export the bundle"
    )
    assert error_of(tmp_path, "op k\n") == (
        f"{root}/manifest.txt: no version record, this runtime reads version 3; "
        "re-export the bundle"
    )
    assert error_of(tmp_path, "op k\n", version=None) == (
        f"{root}/manifest.txt: no version record; re-export the bundle"
    )
    assert open_manifest(tmp_path / "any", "version 7\n", version=None).version == 7


def test_record_lookup_errors(tmp_path):
    b = open_manifest(tmp_path, "version 3\nop k x=abc f=2 g=0 n=1,2,x\n")
    r = b.records[0]
    t = "op k x=abc f=2 g=0 n=1,2,x"
    cases = [
        (lambda: r.value("y"), "`y=` missing"),
        (lambda: r.get("x"), "`x=abc` is malformed"),
        (lambda: r.flag("f"), "`f=2` is not 0 or 1"),
        (lambda: r.flag("missing"), "`missing=` missing"),
        (lambda: r.field(5), "expected at least 6 fields"),
        (lambda: r.field_as(0, int), "field 1 (k) is malformed"),
        (lambda: r.get_list("n"), "`n=1,2,x` is malformed"),
    ]
    for call, msg in cases:
        with pytest.raises(BundleError) as err:
            call()
        assert str(err.value) == f"manifest.txt:2: {msg}, in: {t}"
    assert r.flag("g") is False and r.get_list("n", str) == ["1", "2", "x"]
    assert r.get("absent", int, default=9) == 9


def test_param_and_xclbin_lookup_errors(tmp_path):
    b = open_manifest(tmp_path, "version 3\nparam p 1.5\nparam l 1,,x\n")
    for call, msg in [
        (lambda: b.param("q"), "param q missing from the manifest"),
        (lambda: b.param("p", int), "param p (1.5) is malformed"),
        (lambda: b.param_list("l"), "param l: bad list item x"),
        (lambda: b.param_list("q"), "param q missing from the manifest"),
        (lambda: b.xclbin("ctx9"), "xclbin ctx9 missing from the manifest"),
    ]:
        with pytest.raises(BundleError) as err:
            call()
        assert str(err.value) == msg
    assert b.param("p", float) == 1.5 and b.has_param("p") and not b.has_param("q")


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            "a f32 2 0\n",
            "tensors.txt:1: expected <name> <dtype> <shape> <offset> <bytes>, in: a f32 2 0",
        ),
        (
            "a f32 2 0 8\n\n",
            "tensors.txt:2: expected <name> <dtype> <shape> <offset> <bytes>, in: ",
        ),
        (
            "# c f32 2 0 8 x\n",
            "tensors.txt:1: expected <name> <dtype> <shape> <offset> <bytes>, in: # c f32 2 0 8 x",
        ),
        ("a f16 2 0 8\n", "tensors.txt:1: unknown dtype, in: a f16 2 0 8"),
        ("a f32 2,,1 0 8\n", "tensors.txt:1: bad shape, in: a f32 2,,1 0 8"),
        ("a f32 2,-1 0 8\n", "tensors.txt:1: bad shape, in: a f32 2,-1 0 8"),
        (
            "a f32 18446744073709551616 0 8\n",
            "tensors.txt:1: bad shape, in: a f32 18446744073709551616 0 8",
        ),
        ("a f32 2 0x0 8\n", "tensors.txt:1: bad offset, in: a f32 2 0x0 8"),
        ("a f32 2 0 8.0\n", "tensors.txt:1: bad byte count, in: a f32 2 0 8.0"),
        ("a f32 2 4 8\n", "tensors.txt:1: offset is not 8-byte aligned, in: a f32 2 4 8"),
        (
            "a f32 2 0 6\n",
            "tensors.txt:1: byte count is not a whole number of elements, in: a f32 2 0 6",
        ),
        ("a f32 2 0 8\na u8 1 8 1\n", "tensors.txt:2: tensor defined twice, in: a u8 1 8 1"),
        ("a f32 2 0 8\nz u8 1 64 5\n", "tensor z runs past the end of tensors.bin"),
        ("big u8 1 8 18446744073709551615\n", "tensor big runs past the end of tensors.bin"),
        ("far u8 1 18446744073709551608 8\n", "tensor far runs past the end of tensors.bin"),
    ],
)
def test_tensor_table_errors(tmp_path, tensors, message):
    assert error_of(tmp_path, "version 3\n", tensors) == message


def test_tensor_lookup_errors(tmp_path):
    b = open_manifest(tmp_path, "version 3\n")
    for call, msg in [
        (lambda: b.entry("zz"), "tensor zz missing from the bundle"),
        (lambda: b.view("a", "bf16"), "tensor a is F32, wanted Bf16"),
        (lambda: b.expect("a", "f32", 3), "tensor a is 2 x F32, wanted 3 x F32"),
        (lambda: b.expect("b", "i32", 2), "tensor b is 2 x Bf16, wanted 2 x I32"),
    ]:
        with pytest.raises(BundleError) as err:
            call()
        assert str(err.value) == msg
    assert b.expect("b", "bf16", 2).shape == (1, 2)


def test_recorded_shape_is_not_checked_until_a_shaped_view_is_asked(tmp_path):
    tensors = "a f32 2 0 8\nhuge u8 99999999999,99999999999,99999999999 0 4\n"
    b = Bundle.open(make(tmp_path / "b", "version 3\n", tensors), version=3)
    assert b.view("huge").shape == (4,)
    with pytest.raises(BundleError, match="^tensor huge has shape 99999999999,99999999999,"):
        b.array("huge")


def test_views_are_read_only_and_backed_by_the_mapping(tmp_path):
    b = open_manifest(tmp_path, "version 3\n")
    v = b.view("a")
    assert not v.flags.writeable
    assert isinstance(v.base, np.memmap) or isinstance(v, np.memmap)
    copy = b.f32("a")
    copy[0] = 0.0
    assert b.view("a")[0] == 3.5


def test_views_after_close_are_refused(tmp_path):
    with open_manifest(tmp_path, "version 3\n") as b:
        kept = b.view("a")
    with pytest.raises(BundleError, match="bundle is closed"):
        b.view("a")
    assert kept[1] == -1.0  # a view handed out keeps its mapping alive


def test_empty_tensors_bin_and_empty_table(tmp_path):
    b = Bundle.open(make(tmp_path / "b", "version 3\n", "", b""), version=3)
    assert b.tensors == {}


def test_io_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(BundleError) as err:
        Bundle.open(missing)
    assert str(err.value) == f"{missing}/manifest.txt: No such file or directory (os error 2)"
    root = make(tmp_path / "b", "version 3\n")
    (root / "tensors.bin").unlink()
    with pytest.raises(BundleError) as err:
        Bundle.open(root)
    assert str(err.value) == f"{root}/tensors.bin: No such file or directory (os error 2)"


def test_invalid_utf8_is_a_bundle_error(tmp_path):
    root = make(tmp_path / "b", b"version 3\n\xff\n")
    with pytest.raises(BundleError) as err:
        Bundle.open(root)
    assert str(err.value) == f"{root}/manifest.txt: stream did not contain valid UTF-8"


def test_old_layouts_are_refused_with_a_hint(tmp_path):
    old = tmp_path / "adaface"
    old.mkdir()
    (old / "plan.txt").write_text("conv ...\n")
    with pytest.raises(BundleError, match="plan.txt and no manifest.txt.*re-export"):
        Bundle.open(old)
    gaic = tmp_path / "gaic"
    gaic.mkdir()
    (gaic / "manifest.txt").write_text("gaic 1\n")
    with pytest.raises(BundleError, match="starting with `gaic ` and no tensors.txt.*re-export"):
        Bundle.open(gaic)


# -- path confinement ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "reason"),
    [
        ("../outside.xclbin", "path ../outside.xclbin climbs out with .."),
        ("kernels/../../x.xclbin", "path kernels/../../x.xclbin climbs out with .."),
        ("/etc/passwd", "path /etc/passwd is absolute"),
    ],
)
def test_xclbin_record_paths_must_stay_inside(tmp_path, rel, reason):
    text = f"version 3\nxclbin c {rel} MLIR_AIE\n"
    assert error_of(tmp_path, text) == f"manifest.txt:2: {reason}, in: xclbin c {rel} MLIR_AIE"


def test_finding_8_symlinked_files_load_and_only_the_manifest_text_is_confined(tmp_path):
    """taconite-bundle joins any path and the OS follows symlinks on open, so a bundle whose
    files link elsewhere (an HF cache snapshot) loads; npucam refused every symlink that
    resolved outside. npucam still refuses absolute paths and `..` in the manifest text
    (its own policy, stricter than taconite), which is what a bundle's author controls."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "k.xclbin").write_bytes(b"x")
    real = tmp_path / "elsewhere.bin"
    real.write_bytes(TENSORS_BIN)
    root = make(tmp_path / "b", "version 3\nop k insts=link/k.bin\nxclbin c link/k.xclbin M\n")
    (root / "tensors.bin").unlink()
    os.symlink(real, root / "tensors.bin")
    os.symlink(outside, root / "link")
    b = Bundle.open(root, version=3)
    assert b.records[0].path("insts") == root / "link" / "k.bin"
    assert b.xclbin("c").path == root / "link" / "k.xclbin"
    assert b.xclbin("c").path.read_bytes() == b"x"
    assert b.view("a").tolist() == [3.5, -1.0]  # read through the tensors.bin symlink
    for rel in ("../outside/k.xclbin", "link/../../outside/k.xclbin", str(outside / "k.xclbin"),
                ""):  # fmt: skip
        with pytest.raises(BundleError):
            b.path(rel)


def test_bundle_error_is_a_project_error():
    assert issubclass(BundleError, NpucamError)


# -- fuzzing ---------------------------------------------------------------------------------

MANIFEST_WORDS = st.sampled_from(
    [
        "version",
        "param",
        "xclbin",
        "#",
        "#x",
        "op",
        "k=v",
        "=",
        "a=b=c",
        "1",
        "+1",
        "3",
        "4294967296",
        "..",
        "../x",
        "/abs",
        "kernels/a",
        " ",
        "  ",
        "\t",
        "\r",
        "\n",
        "\r\n",
        "\x1f",
        "\u3000",
        "é",
        "\x00",
        "x=",
        "9" * 5000,
        "inf",
    ]
)
TENSOR_WORDS = st.sampled_from(
    [
        "a",
        "b",
        "f32",
        "bf16",
        "u8",
        "i32",
        "f16",
        "1",
        "2,3",
        "2,,3",
        "0",
        "8",
        "64",
        "4",
        "3",
        "18446744073709551616",
        "-1",
        "+8",
        " ",
        "\n",
        "\r\n",
        "\t",
        "#",
        "1" * 5000,
    ]
)
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def assert_only_bundle_errors(manifest: bytes, tensors: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = make(Path(d), manifest, tensors, TENSORS_BIN)
        try:
            b = Bundle.open(root, version=3)
        except BundleError:
            return
        for r in b.records:
            for call in (
                lambda r=r: r.get("k"),
                lambda r=r: r.flag("k"),
                lambda r=r: r.path("k"),
                lambda r=r: r.field_as(0),
                lambda r=r: r.rest(2),
            ):
                with contextlib.suppress(BundleError):
                    call()
        for name in b.tensors:
            for call in (lambda n=name: b.array(n), lambda n=name: b.f32(n)):
                with contextlib.suppress(BundleError):
                    call()


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_manifest_bytes_raise_only_bundle_errors(data):
    assert_only_bundle_errors(data, TENSORS_TXT.encode())


@FUZZ
@given(st.lists(MANIFEST_WORDS, max_size=40).map(lambda ws: " ".join(ws).encode()))
def test_token_soup_manifests_raise_only_bundle_errors(data):
    assert_only_bundle_errors(b"version 3\n" + data, TENSORS_TXT.encode())


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_tensor_table_bytes_raise_only_bundle_errors(data):
    assert_only_bundle_errors(b"version 3\n", data)


@FUZZ
@given(st.lists(TENSOR_WORDS, max_size=40).map(lambda ws: " ".join(ws).encode()))
def test_token_soup_tensor_tables_raise_only_bundle_errors(data):
    assert_only_bundle_errors(b"version 3\n", data)
