"""`npucam run`, `validate`, `subscribe` and `keys generate`: the engine's commands.

run exits 0 when the sources end, --duration passes or SIGINT/SIGTERM arrives (after the
drain), 1 when a stage died, 2 for a bad config (pipeline.cli maps NpucamError to 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline import security, wire
from pipeline.config import DEFAULT_MAX_PIXELS
from pipeline.errors import NpucamError
from pipeline.jpeg import JpegError, jpeg_info

log = logging.getLogger(__name__)

# The largest message `subscribe` takes from a publisher, all its parts together (each part
# also through ZMQ_MAXMSGSIZE); npucam's largest are preview JPEGs of a few hundred KB.
SUBSCRIBE_MAX_MESSAGE_BYTES = 64 << 20


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run a pipeline config")
    p.add_argument("config", help="TOML config file (docs/configuration.md)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="stop after S seconds (default: until the sources end or a signal)",
    )
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser("validate", help="check a config without running it")
    p.add_argument("config")
    p.add_argument(
        "--import",
        dest="import_modules",
        action="store_true",
        help='also import the modules of `kind = "module:Class"` stages that are not '
        "registered kinds, and check their keys (runs their import-time code)",
    )
    p.set_defaults(func=cmd_validate)

    p = subparsers.add_parser("subscribe", help="print published messages as JSON lines")
    p.add_argument("endpoint", help="ZeroMQ endpoint to connect to, e.g. tcp://127.0.0.1:5560")
    p.add_argument("--topic", default="", metavar="PREFIX", help="topic prefix (default: all)")
    p.add_argument("--count", type=int, default=None, metavar="N", help="exit after N messages")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="exit (status 1) if no message arrives for S seconds",
    )
    security.add_client_key_args(p, "subscriber")
    p.add_argument(
        "--max-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        metavar="N",
        help="do not decode a preview JPEG whose header claims more pixels "
        f"(default {DEFAULT_MAX_PIXELS})",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=SUBSCRIBE_MAX_MESSAGE_BYTES,
        metavar="N",
        help="skip a message whose parts add up to more (read part by part, none kept), and "
        "drop the connection of a publisher that sends a larger part (ZMQ_MAXMSGSIZE; "
        f"default {SUBSCRIBE_MAX_MESSAGE_BYTES})",
    )
    p.set_defaults(func=cmd_subscribe)

    p = subparsers.add_parser("keys", help="CURVE key files (docs/security.md)")
    keys = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    g = keys.add_parser(
        "generate", help="write NAME.key (public) and NAME.key_secret (the pair, mode 0600)"
    )
    g.add_argument("name", help="file name stem: letters, digits, '_' and '-'")
    g.add_argument("--dir", default=".", metavar="DIR", help="where to write (default: .)")
    g.add_argument("--force", action="store_true", help="overwrite existing key files")
    g.set_defaults(func=cmd_keys_generate)


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.graph import Pipeline, load

    config, _ = load(args.config)
    pipeline = Pipeline(config)
    # Stages' blocking work runs on this executor. A worker stuck in a call that never
    # returns must not keep the process alive after the run, so it is not joined at exit.
    executor = ThreadPoolExecutor(thread_name_prefix=WORKER_PREFIX)
    loop = asyncio.new_event_loop()
    loop.set_default_executor(executor)
    try:
        code = loop.run_until_complete(pipeline.run(duration=args.duration))
    finally:
        loop.close()  # shuts the executor down without waiting
    stuck = _stuck_workers(timeout=2.0)
    if stuck or pipeline.abandoned:
        log.error(
            "exiting without waiting for %s still inside a blocking call",
            ", ".join(pipeline.abandoned + stuck),
        )
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)
    return code


WORKER_PREFIX = "npucam-worker"


def _stuck_workers(timeout: float) -> list[str]:
    """Names of executor threads still running after up to timeout s of waiting."""
    end = time.monotonic() + timeout
    workers = [t for t in threading.enumerate() if t.name.startswith(WORKER_PREFIX)]
    for t in workers:
        t.join(max(0.0, end - time.monotonic()))
    return [t.name for t in workers if t.is_alive()]


def cmd_validate(args: argparse.Namespace) -> int:
    from pipeline.graph import load, stage_warnings

    config, checked = load(args.config, import_modules=args.import_modules)
    for line in stage_warnings(config, checked):
        print(f"warning: {line}", file=sys.stderr)
    print(
        f"{args.config}: ok ({len(config.cameras)} camera(s): "
        f"{', '.join(c.name for c in config.cameras) or '-'}; stages: "
        f"{', '.join(config.stage_names)})"
    )
    return 0


def summarise(array: np.ndarray, desc: dict, max_pixels: int = DEFAULT_MAX_PIXELS) -> dict:
    """A JSON-sized view of one binary part: dtype, shape, and its values or their range; a
    JPEG is decoded only if its SOF segment claims at most max_pixels and its markers pass
    pipeline.jpeg.jpeg_info (scan count, coding), else `refused` says why."""
    out = {"dtype": desc["dtype"], "shape": desc["shape"]}
    if desc.get("encoding") == "jpeg":
        import cv2

        out["encoding"] = "jpeg"
        out["bytes"] = int(array.size)
        try:
            info = jpeg_info(array.tobytes())
        except JpegError as exc:
            out["refused"] = str(exc)
            return out
        if info.height * info.width > max_pixels:
            out["refused"] = (
                f"JPEG claims {info.height}x{info.width} pixels, over the limit of {max_pixels} "
                "(--max-pixels)"
            )
            return out
        image = cv2.imdecode(array, cv2.IMREAD_COLOR)
        out["decoded"] = list(image.shape) if image is not None else "undecodable"
    elif array.size <= 16:
        out["values"] = array.tolist()
    elif array.size:
        out["min"] = float(array.min())
        out["max"] = float(array.max())
        out["mean"] = round(float(array.mean(dtype=np.float64)), 6)
    return out


def describe(msg: wire.Message, max_pixels: int = DEFAULT_MAX_PIXELS) -> dict:
    """The JSON line subscribe prints for one message."""
    header = {k: v for k, v in msg.header.items() if k != "parts"}
    parts = {
        desc["name"]: summarise(msg.arrays[desc["name"]], desc, max_pixels)
        for desc in msg.header.get("parts", [])
    }
    return {"topic": msg.topic, **header, "parts": parts}


def cmd_keys_generate(args: argparse.Namespace) -> int:
    public, secret = security.generate_keys(args.name, args.dir, force=args.force)
    print(f"{public}: public key (give it to the peers that must trust this one)")
    print(f"{secret}: key pair, mode 0600 (keep it on this machine)")
    return 0


def receive_bounded(sock, max_bytes: int) -> tuple[list[bytes] | None, int]:
    """One message's parts and its size in bytes; None for the parts when they add up to more
    than max_bytes: each part is then let go as it is read (libzmq has no limit per message,
    only per part)."""
    parts: list[bytes] | None = []
    size = 0
    while True:
        frame = sock.recv(copy=False)
        size += len(frame)
        if parts is not None and size <= max_bytes:
            parts.append(frame.bytes)
        else:
            parts = None
        if not frame.more:
            return parts, size


def cmd_subscribe(args: argparse.Namespace) -> int:
    import zmq

    curve = security.curve_of_args(args, "subscribe")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, args.max_message_bytes)
    sock.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    try:
        security.SocketSecurity(ctx, curve, "subscribe").connect(sock, args.endpoint)
    except zmq.ZMQError as exc:
        sock.close()
        ctx.term()
        raise NpucamError(f"subscribe: cannot connect to {args.endpoint}: {exc}") from None
    received = bad = 0
    timeout_ms = None if args.timeout is None else int(args.timeout * 1000)
    try:
        while args.count is None or received < args.count:
            if not sock.poll(timeout_ms):
                print(f"npucam: no message for {args.timeout:g} s", file=sys.stderr)
                return 1
            parts, size = receive_bounded(sock, args.max_message_bytes)
            if parts is None:
                bad += 1
                print(
                    f"npucam: skipped a message of {size} bytes, over --max-message-bytes "
                    f"{args.max_message_bytes}",
                    file=sys.stderr,
                )
                continue
            try:
                line = describe(wire.decode(parts), args.max_pixels)
                text = json.dumps(line, separators=(",", ":"))
            except (wire.WireError, ValueError, TypeError) as exc:
                bad += 1
                print(f"npucam: skipped malformed message: {exc}", file=sys.stderr)
                continue
            refused = [n for n, part in line["parts"].items() if "refused" in part]
            if refused:
                bad += 1
                print(
                    f"npucam: {line['topic']} seq {line.get('seq')}: not decoded: "
                    + "; ".join(f"{n}: {line['parts'][n]['refused']}" for n in refused),
                    file=sys.stderr,
                )
            print(text, flush=True)
            received += 1
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # `npucam subscribe ... | head`
        sys.stderr.close()
    finally:
        sock.close()
        ctx.term()
        if bad and not sys.stderr.closed:
            print(f"npucam: {bad} malformed message(s)", file=sys.stderr)
    return 0
