"""`npucam face ...`: enrol, identify, list and remove identities in a face gallery file.

Enrolment reads still images, or a camera (any stages.sources url) for up to --seconds,
keeping the --samples sharpest gated faces spread over time. Images and frames go through
the same chain as the face-ID stage: BlazeFace -> 4-point alignment -> AdaFace (cpu: a
cvlface-style safetensors dir; sim/npu: a bundle) -> the gallery (stages.gallery). `face
check` is taconite's run_ir18 bundle self-check. --synthetic runs the synthetic AdaFace when
--model is missing (stages.commands.models), and everything printed then says SYNTHETIC.
Exit codes: 0 done, 1 an identify found no
known face (or a check mismatched), 2 an error (a bad image or camera, no enrollable face, a
corrupt gallery, ...), each message naming the file or camera.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npu.models.loading import Loaded
from pipeline.messages import Frame
from stages.commands.models import add_synthetic_flag, load_model, tag
from stages.gallery import (
    FaceEncoder,
    FaceObservation,
    FaceRejected,
    GalleryError,
    GalleryFile,
    QualityGate,
    read_image,
)
from stages.sources import CameraReader, CameraSpec, redact

DEFAULT_GALLERY = "gallery.npz"
BACKENDS = ("cpu", "sim", "npu")


def _gallery_path(args: argparse.Namespace) -> Path:
    return Path(args.gallery or os.environ.get("NPUCAM_GALLERY") or DEFAULT_GALLERY)


@contextlib.contextmanager
def _encoder(args: argparse.Namespace) -> Iterator[tuple[FaceEncoder, Loaded]]:
    """The detector + embedder the arguments name (--model, else $NPUCAM_FACE_MODEL; with
    --synthetic the synthetic AdaFace when neither exists), open for the `with` block; the
    loaded model's id is what the gallery records (its fingerprint, as the face_match
    stage's faces carry)."""
    from stages.detectors.blazeface import BlazeFace

    if args.backend not in BACKENDS:
        raise GalleryError(f"--backend {args.backend}: expected one of {', '.join(BACKENDS)}")
    model_dir = args.model or os.environ.get("NPUCAM_FACE_MODEL")
    if not model_dir and not args.synthetic:
        raise GalleryError(
            "no face model: pass --model DIR (or set NPUCAM_FACE_MODEL), or --synthetic for "
            "the synthetic AdaFace (its identities mean nothing)"
        )
    with load_model("adaface", model_dir, args.backend, args.synthetic) as loaded:
        if args.yunet:
            from stages.detectors.yunet import YuNet

            detector = YuNet(args.yunet)
        else:
            detector = BlazeFace(args.detector)
        yield FaceEncoder(detector, loaded.model), loaded


def cmd_enroll(args: argparse.Namespace) -> int:
    if bool(args.images) == bool(args.camera):
        raise GalleryError(f"{args.name}: give either IMAGES or --camera URL, not both or neither")
    with _encoder(args) as (encoder, loaded):
        return _enroll(args, encoder, loaded)


def _enroll(args: argparse.Namespace, encoder: FaceEncoder, loaded: Loaded) -> int:
    model_id = loaded.model_id
    gate = QualityGate(args.min_face_px, args.min_score, args.min_sharpness, args.max_nose_offset)
    if args.camera:
        faces, rejected = camera_enrolment_faces(
            encoder, gate, args.camera, args.seconds, args.samples
        )
        samples = [encoder.embed_crop(f.crop) for f in faces]
    else:
        samples, errors = [], []
        for image_path in args.images:
            try:
                samples.append(encoder.enrolment_sample(read_image(image_path), gate, image_path))
            except GalleryError as exc:
                errors.append(str(exc))
        for msg in errors:
            print(f"rejected: {msg}", file=sys.stderr)
        rejected = len(errors)
        if not samples:
            raise GalleryError(f"{args.name}: no image passed the quality gate; nothing enrolled")
    store = GalleryFile(_gallery_path(args), encoder.embedder.embed_dim(), model_id)
    g = store.enrol(args.name, np.stack(samples), model=model_id)
    weights = f" (SYNTHETIC weights {model_id}: for synthetic pipelines only)"
    print(
        f"enrolled {args.name!r}: {len(samples)} sample(s), {rejected} rejected; "
        f"{store.path} holds {len(g.identities())} identities"
        + (weights if loaded.synthetic else "")
    )
    return 0


@dataclass(frozen=True)
class _Candidate:
    """A frame's face that passed the gate: its capture time (s) and the face."""

    t_s: float
    face: FaceObservation


class _Newest:
    """A one-frame slot: the camera thread overwrites it, so a slow consumer sees the newest
    frame and never a backlog (the live-source policy of stages.sources)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._frame: Frame | None = None

    def put(self, frame: Frame) -> None:
        with self._lock:
            self._frame = frame
            self._ready.set()

    def take(self, timeout: float) -> Frame | None:
        if not self._ready.wait(timeout):
            return None
        with self._lock:
            frame, self._frame = self._frame, None
            self._ready.clear()
            return frame


def camera_enrolment_faces(
    encoder: FaceEncoder, gate: QualityGate, url: str, seconds: float, samples: int
) -> tuple[list[FaceObservation], int]:
    """Read the camera at url for up to `seconds` (or until a file or folder ends), gate the
    one face of each frame taken (FaceEncoder.enrolment_face), print the accepted/rejected
    counts with reasons; return up to `samples` faces picked by `spread_best` and the number
    of frames rejected.

    GalleryError names the camera when it gives no frame or no face passes the gate.
    """
    where = repr(redact(url))
    slot = _Newest()
    reader = CameraReader(CameraSpec("enrol", url, end="stop"), slot.put)
    accepted: list[_Candidate] = []
    reasons: collections.Counter[str] = collections.Counter()
    frames = 0
    reader.start()
    deadline = time.monotonic() + seconds
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            frame = slot.take(min(0.2, remaining))
            if frame is None:
                if reader.health == "ended":
                    break
                continue
            frames += 1
            try:
                face = encoder.enrolment_face(frame.image, gate, f"{where} frame {frame.seq}")
            except FaceRejected as exc:
                reasons[exc.reason.removeprefix("rejected: ").split(":")[0]] += 1
                continue
            accepted.append(_Candidate(frame.capture_ts_ns / 1e9, face))
    finally:
        reader.stop()
    if frames == 0:
        error = reader.stats()["last_error"] or f"no frame within {seconds:g} s"
        raise GalleryError(f"camera {where}: cannot read a frame: {error}")
    why = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
    print(
        f"camera {where}: {frames} frame(s) read, {len(accepted)} passed the quality gate, "
        f"{frames - len(accepted)} rejected" + (f" ({why})" if why else "")
    )
    if not accepted:
        raise GalleryError(
            f"camera {where}: no face passed the quality gate in {frames} frame(s); "
            "nothing enrolled"
        )
    return [c.face for c in spread_best(accepted, samples)], frames - len(accepted)


def spread_best(candidates: list[_Candidate], n: int) -> list[_Candidate]:
    """Up to n candidates, sharpest first (then by detector score), each at least
    span / (2n) seconds from every one already taken (span: first to last candidate), so
    near-identical consecutive frames are not enrolled twice; returned in time order."""
    span = candidates[-1].t_s - candidates[0].t_s
    min_gap = span / (2 * n)
    taken: list[_Candidate] = []
    for c in sorted(candidates, key=lambda c: (-c.face.sharpness, -c.face.score)):
        if len(taken) == n:
            break
        if all(abs(c.t_s - t.t_s) >= min_gap for t in taken):
            taken.append(c)
    return sorted(taken, key=lambda c: c.t_s)


def cmd_identify(args: argparse.Namespace) -> int:
    store = GalleryFile(_gallery_path(args))
    if not store.path.exists():
        raise GalleryError(f"{store.path}: no such gallery file (enroll someone first)")
    with _encoder(args) as (encoder, loaded):
        return _identify(args, store, encoder, loaded)


def _identify(
    args: argparse.Namespace, store: GalleryFile, encoder: FaceEncoder, loaded: Loaded
) -> int:
    model_id = loaded.model_id
    if store.current.model and store.current.model != model_id:
        raise GalleryError(
            f"{store.path}: gallery was enrolled with {store.current.model!r}, "
            f"not this model {model_id!r}"
        )
    faces = encoder.faces(read_image(args.image))
    results = []
    for i, f in enumerate(faces):
        m = store.current.identify(f.embedding, args.threshold, args.margin)
        results.append(
            {
                "face": i,
                "box": [round(float(v), 1) for v in f.box],
                "score": round(f.score, 4),
                "identity": m.name,
                "similarity": round(m.similarity, 4),
                "margin": round(m.margin, 4),
                "best": m.best,
                "reason": m.reason,
            }
        )
    if args.json:
        doc = {"image": args.image, "model": model_id, "synthetic": loaded.synthetic}
        print(json.dumps({**doc, "faces": results}))
    elif not results:
        print(f"{args.image}: no face found{tag(loaded)}")
    elif loaded.synthetic:
        print(f"SYNTHETIC weights ({model_id}): these identities and similarities mean nothing")
    for r in [] if args.json else results:
        who = r["identity"] or f"unknown ({r['reason']}, best {r['best']!r})"
        print(
            f"face {r['face']}: box {r['box']} score {r['score']:.2f} -> {who} "
            f"similarity {r['similarity']:.3f} margin {r['margin']:.3f}{tag(loaded)}"
        )
    return 0 if any(r["identity"] for r in results) else 1


def cmd_list(args: argparse.Namespace) -> int:
    path = _gallery_path(args)
    if not path.exists():
        print(f"{path}: empty (no gallery file yet)")
        return 0
    g = GalleryFile(path).current
    print(f"{path}: {len(g.identities())} identities, model {g.model or '?'}, dim {g.embed_dim}")
    for name, count in g.identities().items():
        print(f"{name}\t{count} sample(s)")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    store = GalleryFile(_gallery_path(args))
    if not store.path.exists():
        raise GalleryError(f"{store.path}: no such gallery file")
    g = store.remove(args.name)
    print(f"removed {args.name!r}; {len(g.identities())} identities left")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """taconite's run_ir18 / run_ir101 self-check of a bundle on the sim or npu device
    (npu.models.adaface.check; reps default $NREPS, else 1): 0 on MATCH, 1 otherwise."""
    from npu.backends import open_device

    return check_command(args.bundle, open_device(args.backend), args.reps)


def check_command(path: str | Path, device: Any, reps: int | None = None) -> int:
    """Print check_bundle's report of the bundle at `path` on `device` (reps default $NREPS,
    else 1); the exit code: 0 on MATCH, else 1."""
    from npu.models.adaface.check import check_bundle, reps_from_env

    report = check_bundle(path, device, reps_from_env() if reps is None else reps)
    print(report.text())
    return 0 if report.passed else 1


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `npucam face {enroll,identify,check,list,remove}`."""
    face = subparsers.add_parser("face", help="face gallery: enroll, identify, list, remove")
    sub = face.add_subparsers(dest="face_command", required=True, metavar="ACTION")

    def common(p: argparse.ArgumentParser, model: bool) -> None:
        p.add_argument(
            "--gallery",
            help=f"gallery file (default $NPUCAM_GALLERY or ./{DEFAULT_GALLERY})",
        )
        if model:
            p.add_argument(
                "--model",
                help="cpu: a cvlface-style safetensors dir; sim/npu: an AdaFace bundle dir "
                "($NPUCAM_FACE_MODEL)",
            )
            p.add_argument("--backend", default="cpu", choices=BACKENDS, help="default cpu")
            add_synthetic_flag(p, "AdaFace")
            p.add_argument(
                "--detector", default="short", choices=("short", "full"), help="BlazeFace range"
            )
            p.add_argument(
                "--yunet",
                metavar="ONNX",
                help="detect with YuNet from this ONNX file (5-point alignment) instead",
            )

    p = sub.add_parser("enroll", help="enrol NAME from face images or a camera")
    p.add_argument("name")
    p.add_argument("images", nargs="*")
    p.add_argument(
        "--camera",
        metavar="URL",
        help="enrol from this camera instead of images (any camera url, e.g. usb:0, rtsp://...)",
    )
    p.add_argument(
        "--seconds", type=_positive(float), default=10.0, help="--camera: read time (default 10)"
    )
    p.add_argument(
        "--samples", type=_positive(int), default=5, help="--camera: samples kept (default 5)"
    )
    common(p, model=True)
    gate = QualityGate()
    p.add_argument("--min-face-px", type=float, default=gate.min_face_px)
    p.add_argument("--min-score", type=float, default=gate.min_score)
    p.add_argument("--min-sharpness", type=float, default=gate.min_sharpness)
    p.add_argument("--max-nose-offset", type=float, default=gate.max_nose_offset)
    p.set_defaults(func=cmd_enroll)

    p = sub.add_parser("identify", help="name every face in IMAGE")
    p.add_argument("image")
    common(p, model=True)
    p.add_argument("--threshold", type=float, default=0.4, help="min cosine (default 0.4)")
    p.add_argument("--margin", type=float, default=0.05, help="min lead over 2nd identity")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=cmd_identify)

    p = sub.add_parser("check", help="self-check an AdaFace bundle (as taconite's run_ir18)")
    p.add_argument("bundle")
    p.add_argument("--backend", default="sim", choices=("sim", "npu"))
    p.add_argument("--reps", type=int, help="forwards to time (default $NREPS, else 1)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("list", help="list enrolled identities")
    common(p, model=False)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("remove", help="remove every sample of NAME")
    p.add_argument("name")
    common(p, model=False)
    p.set_defaults(func=cmd_remove)
