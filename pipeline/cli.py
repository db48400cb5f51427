"""The `npucam` command line: one subcommand group per concern, each in its own module.

This is the composition root: the command modules are the `npucam.commands` entry points
(pyproject.toml), imported when the parser is built, so `pipeline` names no stage or model.
A command module exposes `register(subparsers)`, which adds its parsers with
`set_defaults(func=...)`; func(args) returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from importlib.metadata import entry_points

# One BLAS thread per calling thread: the pipeline already runs its numpy work in several
# threads (detect, the device thread, host glue, dark), and OpenBLAS's own spinning threads
# on a busy machine made a 50 ms simulated pass take 1.7 s (measured; set before numpy loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pipeline.errors import NpucamError

COMMAND_GROUP = "npucam.commands"  # entry points: name = "module" (pyproject.toml)


def command_modules() -> list[str]:
    """The modules of the npucam.commands entry points, in their declared order."""
    return [ep.value for ep in entry_points(group=COMMAND_GROUP)]


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every registered command group."""
    parser = argparse.ArgumentParser(
        prog="npucam", description="Streaming vision pipeline for AMD XDNA NPUs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_modules():
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse argv, run the chosen command, map project errors to exit code 2. A reader that
    stops reading (`npucam bundle info DIR | head`) ends the command quietly, exit 0."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # --help, or a usage error: argparse printed and exits
        _flush_or_quiet()
        raise
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader gone before the last flush is quiet too
        return code
    except NpucamError as exc:
        print(f"npucam: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _quiet_stdout()
        return 0


def _flush_or_quiet() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()


def _quiet_stdout() -> None:
    """stdout's reader is gone: point stdout at /dev/null, so the interpreter's final flush
    of what is still buffered does not fail again at exit."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
