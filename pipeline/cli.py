"""The `npucam` command line: one subcommand group per concern, each in its own module.

This is the composition root: the command modules are the `npucam.commands` entry points
(pyproject.toml, one per command word, named for it), imported when the parser is built, so
`pipeline` names no stage or model. A command module exposes `register(subparsers)`, which adds
its parsers with `set_defaults(func=...)`; func(args) returns the process exit code.
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

COMMAND_GROUP = "npucam.commands"  # entry points: command word = "module" (pyproject.toml)


def command_modules(word: str | None = None) -> list[str]:
    """The modules of the npucam.commands entry points, each once: only the one that registers
    command `word` when an entry point names it, else all of them (for --help, and for a word
    no entry point names, which argparse then refuses with the full list)."""
    eps = entry_points(group=COMMAND_GROUP)
    chosen = [ep for ep in eps if ep.name == word] or list(eps)
    return list(dict.fromkeys(ep.value for ep in chosen))


def command_word(argv: list[str]) -> str | None:
    """The command word of argv: its first argument that is not an option (the top-level
    options, -v and -h, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(word: str | None = None) -> argparse.ArgumentParser:
    """The parser with the command group that registers `word` (see command_modules): the
    others' modules are not imported, so `npucam run` does not pay for calibration's SciPy."""
    parser = argparse.ArgumentParser(
        prog="npucam", description="Streaming vision pipeline for AMD XDNA NPUs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_modules(word):
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse argv, run the chosen command, map project errors to exit code 2. A reader that
    stops reading (`npucam bundle info DIR | head`) ends the command quietly, exit 0."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(command_word(argv)).parse_args(argv)
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
