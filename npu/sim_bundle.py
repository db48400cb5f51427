"""Writing bundles for the simulator: xclbin placeholders, the sim's own instruction streams
and the gemm / mha records its kernels read (docs/device.md); the models' export.py use them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from npu.sim_kernels import (
    CT_MAX_K_FOR_N,
    pack_gemm_b,
)

if TYPE_CHECKING:
    from npu.bundle_writer import BundleWriter


def write_xclbin(writer: BundleWriter, ctx: str, kernel: str = "MLIR_AIE") -> None:
    """An `xclbin <ctx> kernels/<ctx>.xclbin <kernel>` record and a placeholder file (the
    simulator never reads an xclbin; hardware bundles come from IRON's exporter)."""
    writer.xclbin(ctx, f"kernels/{ctx}.xclbin", kernel, data=b"npucam sim placeholder xclbin\n")


def _insts(writer: BundleWriter, key: str, words: int) -> str:
    rel = f"kernels/{key}.bin"
    writer.file(rel, np.arange(words, dtype=np.uint32).tobytes())
    return rel


def write_gemm(
    writer: BundleWriter,
    key: str,
    w: np.ndarray,
    *,
    ctx: str,
    m: int = 256,
    bias: np.ndarray | None = None,
    epilogue: str = "none",
    tile_n: int | None = None,
    tile_k: int = 512,
    ct_k: int | None = None,
    lda: int | None = None,
    c_stride: int | None = None,
    rows: int | None = None,
) -> str:
    """A `gemm` record for the simulator plus its B tensor (pack_gemm_b); returns the
    tensor's name (`<key>.b`). w: float32 [K, N]; bias: float32 [N] or None.

    lda / c_stride / rows, when any is given, write the strided record form of
    taconite-sapiens2 (docs/pose.md): lda (default K), c_stride (default N'), rows
    (default M), and the view sizes a_elems = (rows-1)·lda + K, c_elems = (rows-1)·c_stride + N'.
    """
    k, n = w.shape
    tile_n = tile_n or (128 if k == 512 else 64)
    ct_k = ct_k or CT_MAX_K_FOR_N[tile_n]
    b = pack_gemm_b(w, bias, tile_n, tile_k, ct_k)
    name = f"{key}.b"
    writer.tensor(name, b, "u8")
    fields: dict[str, object] = dict(
        ctx=ctx, insts=_insts(writer, key, 16), M=m, K=k, N=n, tile_n=tile_n,
        tile_k=tile_k, ct_k=ct_k, bias=bias is not None, epilogue=epilogue, b_bytes=b.nbytes,
    )  # fmt: skip
    if lda is not None or c_stride is not None or rows is not None:
        n_out = n // 2 if epilogue == "swiglu" else n
        fields.update(strided_gemm_fields(k, n_out, m, lda, c_stride, rows))
    writer.record("gemm", key, **fields)
    return name


def strided_gemm_fields(
    k: int, n_out: int, m: int, lda: int | None, c_stride: int | None, rows: int | None
) -> dict[str, int]:
    """The strided gemm record fields lda, c_stride, rows, a_elems, c_elems (defaults K, N',
    M); a_elems / c_elems are the A / C view sizes of `rows` rows at those strides."""
    lda, c_stride, rows = lda or k, c_stride or n_out, rows or m
    return dict(
        lda=lda, c_stride=c_stride, rows=rows, a_elems=(rows - 1) * lda + k,
        c_elems=(rows - 1) * c_stride + n_out,
    )  # fmt: skip


def write_mha(
    writer: BundleWriter,
    key: str,
    *,
    ctx: str,
    heads: int,
    seq: int,
    d: int = 64,
    kv_heads: int | None = None,
    seq_pad: int | None = None,
    causal: bool = False,
    token_major: bool = False,
    qscale: str = "host",
    seq_word: int | None = None,
) -> None:
    """An `mha` record for the simulator (fields as SimMha documents)."""
    fields: dict[str, object] = dict(
        ctx=ctx, insts=_insts(writer, key, 16), heads=heads, kv_heads=kv_heads or heads, d=d,
        seq=seq, seq_pad=seq_pad or seq, causal=causal, token_major=token_major, qscale=qscale,
    )  # fmt: skip
    if seq_word is not None:
        fields["seq_word"] = seq_word
    writer.record("mha", key, **fields)


# Kernel kinds defined in their own modules register themselves on import.
