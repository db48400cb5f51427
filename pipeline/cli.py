"""The `npucam` command line: one subcommand group per concern, each in its own module.

This is the composition root: it imports command modules lazily by name, so `pipeline`
itself stays free of model code. A command module exposes `register(subparsers)`, which adds
its parsers with `set_defaults(func=...)`; func(args) returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from pipeline.errors import NpucamError

# Add a module here once it exists; each registers one or more top-level subcommands.
COMMAND_MODULES: tuple[str, ...] = (
    "pipeline.commands",
    "pipeline.view.commands",
    "npu.bundle_commands",
    "npu.device_commands",
    "stages.face_commands",
    "stages.clip_commands",
    "stages.pose_commands",
    "stages.plan_commands",
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every registered command group."""
    parser = argparse.ArgumentParser(
        prog="npucam", description="Streaming vision pipeline for AMD XDNA NPUs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse argv, run the chosen command, map project errors to exit code 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except NpucamError as exc:
        print(f"npucam: error: {exc}", file=sys.stderr)
        return 2
