"""The `npucam` entry point: a reader that goes away (`npucam bundle info DIR | head`) ends any
command quietly with exit 0, instead of a BrokenPipeError traceback (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_into_a_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    """Run `python -m pipeline ARGS` with stdout a pipe whose reader has already gone, so
    every write to it fails with EPIPE (as once `head` has exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "pipeline", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [
        ["bundle", "info", "SYNTHETIC_BUNDLE"],
        ["validate", "configs/multicam-pose.toml"],
        ["--help"],
    ],
)
def test_a_reader_that_went_away_ends_the_command_quietly(args):
    from npu.models.synthetic import bundle_path

    args = [str(bundle_path("sapiens2")) if a == "SYNTHETIC_BUNDLE" else a for a in args]
    done = run_into_a_closed_pipe(args)
    assert done.returncode == 0, done.stderr
    assert "BrokenPipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_each_command_entry_point_is_named_for_a_word_its_module_registers():
    """pyproject.toml names each npucam.commands entry point for its command word: the module
    behind it registers exactly the words of its entry points, so the parser built for one word
    holds that command."""
    import argparse
    import importlib
    from importlib.metadata import entry_points

    from pipeline.cli import COMMAND_GROUP

    words: dict[str, set[str]] = {}
    for ep in entry_points(group=COMMAND_GROUP):
        words.setdefault(ep.value, set()).add(ep.name)
    assert words, "no npucam.commands entry points: is npucam installed (make setup)?"
    for module, names in words.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert set(sub.choices) == names, module


def test_a_command_imports_only_its_own_module_and_help_lists_them_all():
    """`npucam run ...` builds a parser without calibration's module (and its SciPy); a word no
    entry point names, and --help, get every command."""
    code = (
        "import sys; from pipeline.cli import build_parser, command_word;"
        "p = build_parser(command_word(sys.argv[1:]));"
        "print(sorted(p._subparsers._group_actions[0].choices));"
        "print('stages.commands.calibrate' in sys.modules, 'scipy.optimize' in sys.modules)"
    )

    def parser_of(*argv: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
            check=True,
        ).stdout.splitlines()
        return out

    assert parser_of("-v", "run", "configs/demo.toml") == [
        "['keys', 'run', 'subscribe', 'validate']",
        "False False",
    ]
    everything = parser_of("--help-me-not-a-command", "frobnicate")
    assert "'calibrate'" in everything[0] and "'run'" in everything[0] and "'view'" in everything[0]
    assert everything[1].startswith("True")
