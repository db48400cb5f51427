"""`npucam bundle check DIR` and `npucam bundle info DIR`: validate and describe an IRON bundle.

check opens the bundle (every manifest and tensors.txt rule of npu.bundle), then verifies that
each file the manifest names exists inside the bundle (xclbin records, `insts=` and `xclbin=`
fields; instruction streams must be whole u32 words) and that every `ctx=` names a declared
xclbin, and prints a summary of kernels and hardware contexts. The first failure is reported
as an error (non-zero exit).
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from npu.bundle import TENSORS_BIN, Bundle, BundleError

# Record fields that name a bundle file: the instruction stream and the xclbin of an `op` /
# `mha` record that carries its own context.
PATH_KEYS = ("insts", "xclbin")
DEFAULT_KERNEL = "MLIR_AIE"


@dataclass(frozen=True)
class CheckSummary:
    """What `bundle check` found: counts for the report."""

    version: int
    records_per_tag: dict[str, int]
    kernels: int  # records with an instruction stream (`insts=`)
    contexts: int  # distinct (xclbin file, kernel name) pairs the bundle declares or uses
    xclbin_records: int
    files_checked: int
    tensors: int
    tensor_bytes: int


def check_bundle(path: str | Path, version: int | None = None) -> CheckSummary:
    """Open and fully check a bundle; raises BundleError with the first problem found."""
    b = Bundle.open(path, version=version)
    contexts: set[tuple[Path, str]] = set()
    files = 0
    for x in sorted(b.manifest.xclbins.values(), key=lambda x: x.line):
        if not x.path.is_file():
            raise BundleError(f"manifest.txt:{x.line}: xclbin {x.key}: file {x.path} is missing")
        contexts.add((x.path, x.kernel))
        files += 1
    kernels = 0
    for r in b.records:
        for key in PATH_KEYS:
            if r.has(key):
                target = r.path(key)
                if not target.is_file():
                    raise r.error(f"`{key}={r.value(key)}` names a missing file")
                size = target.stat().st_size
                # An instruction stream is raw little-endian u32 words (docs/device.md).
                if key == "insts" and (size == 0 or size % 4):
                    raise r.error(f"`insts={r.value(key)}` is not whole u32 words ({size} bytes)")
                files += 1
        if r.has("ctx"):
            ctx = r.value("ctx")
            if ctx not in b.manifest.xclbins:
                raise r.error(f"xclbin {ctx} missing from the manifest")
            x = b.manifest.xclbins[ctx]
            contexts.add((x.path, x.kernel))
        elif r.has("xclbin"):
            name = r.value("name") if r.has("name") else DEFAULT_KERNEL
            contexts.add((r.path("xclbin"), name))
        if r.has("insts"):
            kernels += 1
    return CheckSummary(
        version=b.version,
        records_per_tag=dict(Counter(r.tag for r in b.records)),
        kernels=kernels,
        contexts=len(contexts),
        xclbin_records=len(b.manifest.xclbins),
        files_checked=files,
        tensors=len(b.tensors),
        tensor_bytes=b.tensors_bytes,
    )


def _tags(counts: dict[str, int]) -> str:
    return ", ".join(f"{tag} {n}" for tag, n in counts.items()) or "none"


def cmd_check(args: argparse.Namespace) -> int:
    s = check_bundle(args.dir, args.version)
    print(f"{args.dir}: ok (version {s.version})")
    print(f"records: {_tags(s.records_per_tag)}")
    print(f"kernels: {s.kernels} instruction streams")
    print(
        f"contexts: {s.contexts} distinct (xclbin, kernel name) "
        f"from {s.xclbin_records} xclbin records"
    )
    print(f"files: {s.files_checked} checked, all inside the bundle")
    print(f"tensors: {s.tensors}, {s.tensor_bytes} bytes")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    b = Bundle.open(args.dir, version=args.version)
    print(f"bundle: {args.dir}")
    print(f"version: {b.version}")
    print(f"params: {len(b.manifest.params)}")
    for name, value in b.manifest.params.items():
        print(f"  {name} = {value}")
    print(f"xclbins: {len(b.manifest.xclbins)}")
    for x in b.manifest.xclbins.values():
        print(f"  {x.key}: {x.path.relative_to(b.root)} {x.kernel}")
    print(f"records: {len(b.records)} ({_tags(dict(Counter(r.tag for r in b.records)))})")
    dtypes = Counter(e.dtype for e in b.tensors.values())
    per_dtype = ", ".join(f"{d} {n}" for d, n in sorted(dtypes.items())) or "none"
    print(f"tensors: {len(b.tensors)} ({per_dtype}), {b.tensors_bytes} bytes")
    print(f"tensors.bin: {(b.root / TENSORS_BIN).stat().st_size} bytes")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bundle check` and `bundle info`."""
    bundle = subparsers.add_parser("bundle", help="check or describe an IRON bundle directory")
    sub = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    for name, func, text in (
        ("check", cmd_check, "validate records, tensors and files; summarise kernels/contexts"),
        ("info", cmd_info, "print params, record counts, tensor count and bytes"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("dir", help="bundle directory")
        p.add_argument(
            "--version",
            type=int,
            default=None,
            help="require this bundle version (default: accept the one recorded)",
        )
        p.set_defaults(func=func)
