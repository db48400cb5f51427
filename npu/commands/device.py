"""`npucam device`: which backends (npu, sim, cpu) can run here and, for each missing one, why.

npu needs pyxrt (XRT's Python bindings) and /dev/accel/accel0 (npu.xrt.probe); sim and cpu
need only numpy. The sim line also shows the machine-wide simulated context table.
"""

from __future__ import annotations

import argparse
import json

from npu import xrt
from npu.device import ctx_cache_cap, timing_enabled
from npu.sim import HWCTX_LIMIT, ContextRegistry, default_registry_dir


def backends(device_node: str = xrt.DEVICE_NODE) -> list[dict[str, object]]:
    """One entry per backend: name, available, and either why not or what it runs on."""
    _, missing = xrt.probe(device_node)
    registry = ContextRegistry(default_registry_dir(), HWCTX_LIMIT)
    held = registry.held()
    return [
        {
            "backend": "npu",
            "available": not missing,
            "detail": "; ".join(missing) if missing else f"pyxrt and {device_node}",
        },
        {
            "backend": "sim",
            "available": True,
            "detail": (
                f"simulated NPU2 in numpy; {len(held)} of {HWCTX_LIMIT} simulated contexts held "
                f"machine-wide ({registry.dir})"
            ),
        },
        {"backend": "cpu", "available": True, "detail": "numpy forward from HF checkpoints"},
    ]


def cmd_device(args: argparse.Namespace) -> int:
    rows = backends(args.device_node)
    settings = {
        "TACONITE_CTX_CACHE": ctx_cache_cap(),
        "TACONITE_TIMING": timing_enabled(),
    }
    if args.json:
        print(json.dumps({"backends": rows, "settings": settings}, indent=2))
        return 0
    for row in rows:
        state = "available" if row["available"] else "missing"
        print(f"{row['backend']:<4} {state:<9}  {row['detail']}")
    print(
        f"context cache cap {settings['TACONITE_CTX_CACHE']} (TACONITE_CTX_CACHE), timing "
        f"{'on' if settings['TACONITE_TIMING'] else 'off'} (TACONITE_TIMING)"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `device`."""
    p = subparsers.add_parser("device", help="which backends are available here, and why not")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--device-node", default=xrt.DEVICE_NODE, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_device)
