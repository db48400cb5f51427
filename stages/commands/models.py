"""The model a prediction command runs (`face`, `clip`, `pose`): its --model path on its
--backend, or with --synthetic the synthetic stand-in the configs use when that path is
missing (npu.models.loading.load, the one loader of the pipeline too), and how its output says so.

A command never passes synthetic predictions off as real: whenever the weights are synthetic
(--synthetic, or a --model directory of synthetic weights) it says so loudly on stderr, and
its text and JSON output carry SYNTHETIC / "synthetic": true."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from npu.models.loading import Loaded, ModelSource, load
from pipeline.errors import NpucamError
from pipeline.files import path_kind


class ModelArgumentError(NpucamError):
    """A --model / --backend / --synthetic combination that names no model to run."""


def add_synthetic_flag(parser: argparse.ArgumentParser, what: str, path: str = "--model") -> None:
    """The --synthetic flag of a prediction command (`path`: its model argument)."""
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help=f"when {path} is not given or does not exist, run the synthetic {what} "
        "(random weights, as the configs' `synthetic = true`; on cpu and sim only): every "
        "output says SYNTHETIC and means nothing",
    )


@contextlib.contextmanager
def load_model(name: str, model: str | None, backend: str, synthetic: bool) -> Iterator[Loaded]:
    """Model `name` from `model` (a checkpoint for cpu, a bundle for sim / npu), or its
    synthetic stand-in when `synthetic` and the path is unset or missing, for the `with`
    block: the model and the device it opened are closed after it (their hardware
    contexts are the machine's). Prints the warning banner when the weights are synthetic."""
    missing = model is None or path_kind(model) == "missing"
    if missing and not synthetic:
        kind = "checkpoint" if backend == "cpu" else "bundle"
        what = "no model given" if model is None else f"{model}: no such file or folder"
        raise ModelArgumentError(
            f"{what}: pass --model with the model's {kind} (backend {backend}), or --synthetic "
            "to run the synthetic stand-in (its outputs mean nothing)"
        )
    device = None
    if backend != "cpu":
        from npu.backends import open_device

        device = open_device(backend)
    source = ModelSource(
        checkpoint=model if backend == "cpu" else None,
        bundle=model if backend != "cpu" else None,
        synthetic=synthetic,
        where="--model",
    )
    try:
        loaded = load(name, source, backend, device)
    except BaseException:
        if device is not None:
            device.close()
        raise
    try:
        _banner(loaded, name, model, backend, synthetic)
        yield loaded
    finally:
        close = getattr(loaded.model, "close", None)
        try:
            if device is not None and callable(close):
                close()
        finally:
            if device is not None:
                device.close()


def _banner(loaded: Loaded, name: str, model: str | None, backend: str, synthetic: bool) -> None:
    if loaded.synthetic:
        print(
            f"npucam: WARNING: SYNTHETIC {name} weights ({loaded.model_id}, random from a fixed "
            "seed): every result below is meaningless; give --model a real "
            f"{'checkpoint' if backend == 'cpu' else 'bundle'} for real results",
            file=sys.stderr,
        )
    elif synthetic:
        print(
            f"npucam: --model {model} exists: real weights; --synthetic not used", file=sys.stderr
        )


def tag(loaded: Loaded) -> str:
    """ " SYNTHETIC" for a text line about synthetic results, else ""."""
    return " SYNTHETIC" if loaded.synthetic else ""


def is_bundle(path: str | Path) -> bool:
    """A directory with a manifest.txt (an IRON bundle), never raising."""
    return path_kind(Path(path) / "manifest.txt") == "file"
