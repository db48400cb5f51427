"""`npucam bundle check` / `bundle info` through the real CLI entry point."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pipeline.cli
from npu.bundle_writer import BundleWriter
from npu.commands.bundle import check_bundle
from pipeline.cli import main


@pytest.fixture(autouse=True)
def only_bundle_commands(monkeypatch):
    """The real entry point (parsing, error to exit code) with only this command group, so
    other groups' import problems cannot fail these tests."""
    monkeypatch.setattr(pipeline.cli, "command_modules", lambda word=None: ["npu.commands.bundle"])


def write_bundle(root, *, insts_missing=False, ctx="ctx0"):
    with BundleWriter(root, version=1) as w:
        w.param("name", "tiny")
        w.xclbin("ctx0", "kernels/gemm.xclbin", data=b"x")
        w.xclbin("ctx1", "kernels/other.xclbin", "other_kernel", data=b"y")
        w.file("kernels/mha.xclbin", b"z")
        for i in range(3):
            if not (insts_missing and i == 2):
                w.file(f"kernels/g{i}.bin", b"\0\0\0\0")
            w.record("gemm", f"g{i}", ctx=ctx, insts=f"kernels/g{i}.bin", M=256)
        w.file("kernels/m.bin", b"\0\0\0\0")
        w.record("mha", "m", xclbin="kernels/mha.xclbin", insts="kernels/m.bin", heads=2)
        w.record("ref_prompt", tail="a photo of a cat")
        w.tensor("w", np.zeros((4, 4), np.float32))
        w.tensor("b", np.zeros(3, np.uint8))
    return root


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_summarises_kernels_contexts_and_records(tmp_path, capsys):
    root = write_bundle(tmp_path / "b")
    code, out, _ = run(capsys, "bundle", "check", str(root))
    assert code == 0
    assert "records: gemm 3, mha 1, ref_prompt 1" in out
    assert "kernels: 4 instruction streams" in out
    # ctx0 and ctx1 (declared) plus the mha record's own (xclbin, MLIR_AIE)
    assert "contexts: 3 distinct (xclbin, kernel name) from 2 xclbin records" in out
    assert "tensors: 2, 67 bytes" in out
    s = check_bundle(root, version=1)
    assert s.files_checked == 2 + 3 + 2


def test_check_reports_the_first_error_with_non_zero_exit(tmp_path, capsys):
    root = write_bundle(tmp_path / "b", insts_missing=True)
    code, _, err = run(capsys, "bundle", "check", str(root))
    assert code != 0
    assert "manifest.txt:7: `insts=kernels/g2.bin` names a missing file, in: gemm g2" in err


def test_check_refuses_undeclared_contexts_and_wrong_versions(tmp_path, capsys):
    root = write_bundle(tmp_path / "a", ctx="nope")
    code, _, err = run(capsys, "bundle", "check", str(root))
    assert code != 0 and "manifest.txt:5: xclbin nope missing from the manifest" in err
    root = write_bundle(tmp_path / "b")
    code, _, err = run(capsys, "bundle", "check", str(root), "--version", "2")
    assert code != 0 and "version 1, this runtime reads version 2" in err
    (root / "kernels" / "g0.bin").unlink()
    os.symlink(tmp_path / "a" / "kernels" / "g0.bin", root / "kernels" / "g0.bin")
    code, _, err = run(capsys, "bundle", "check", str(root))
    assert code == 0, err  # a symlinked file loads (an HF snapshot links every file)
    (root / "kernels" / "gemm.xclbin").unlink()
    code, _, err = run(capsys, "bundle", "check", str(root))
    assert code != 0 and "xclbin ctx0: file" in err and "is missing" in err


def test_check_refuses_instruction_streams_that_are_not_whole_words(tmp_path, capsys):
    root = write_bundle(tmp_path / "b")
    (root / "kernels" / "g1.bin").write_bytes(b"\0" * 6)
    code, _, err = run(capsys, "bundle", "check", str(root))
    assert code != 0
    assert "manifest.txt:6: `insts=kernels/g1.bin` is not whole u32 words (6 bytes)" in err


def test_check_on_a_missing_directory(tmp_path, capsys):
    code, _, err = run(capsys, "bundle", "check", str(tmp_path / "none"))
    assert code != 0 and "No such file or directory" in err


def test_info_lists_params_records_and_tensor_bytes(tmp_path, capsys):
    root = write_bundle(tmp_path / "b")
    code, out, _ = run(capsys, "bundle", "info", str(root))
    assert code == 0
    assert "version: 1" in out and "  name = tiny" in out
    assert "  ctx1: kernels/other.xclbin other_kernel" in out
    assert "records: 5 (gemm 3, mha 1, ref_prompt 1)" in out
    assert "tensors: 2 (f32 1, u8 1), 67 bytes" in out
    assert "tensors.bin: 67 bytes" in out


@pytest.mark.parametrize("action", ["check", "info"])
def test_bundle_actions_need_a_directory_argument(action, capsys):
    with pytest.raises(SystemExit):
        main(["bundle", action])
