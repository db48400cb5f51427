"""`npucam rerun ENDPOINT`: subscribe to a running pipeline and log its previews, 2D poses, 3D
rig people and bodies to Rerun (pipeline/rerun_sink.py), saved to an .rrd file or streamed to
a spawned viewer. Needs the optional extra `rerun` (pip install 'npucam[rerun]').
"""

from __future__ import annotations

import argparse
import sys
import time

from pipeline import security, wire
from pipeline.commands import SUBSCRIBE_MAX_MESSAGE_BYTES, receive_bounded
from pipeline.errors import NpucamError

# what the sink draws; the previews are published only while a subscriber asks for them
TOPICS = ("meta", "preview/", "det/", "pose/", "pose3d/", "body/")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "rerun", help="log a pipeline's cameras, 2D and 3D poses to Rerun (extra `rerun`)"
    )
    p.add_argument("endpoint", help="ZeroMQ endpoint to connect to, e.g. tcp://127.0.0.1:5564")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--save", metavar="FILE.rrd", help="write the recording to this file")
    out.add_argument("--spawn", action="store_true", help="stream to a new Rerun viewer")
    p.add_argument(
        "--no-preview", action="store_true", help="do not ask for the preview JPEGs (3D only)"
    )
    p.add_argument("--count", type=int, default=None, metavar="N", help="stop after N messages")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S s")
    security.add_client_key_args(p, "subscriber")
    p.set_defaults(func=cmd_rerun)


def cmd_rerun(args: argparse.Namespace) -> int:
    try:
        import rerun as rr
    except ImportError:
        raise NpucamError(
            "npucam rerun needs rerun-sdk: pip install 'npucam[rerun]' (docs/rerun.md)"
        ) from None
    import zmq

    from pipeline.rerun_sink import RerunSink

    rec = rr.RecordingStream("npucam")
    if args.save:
        rec.save(args.save)
    else:
        rec.spawn()
    sink = RerunSink(rec)
    curve = security.curve_of_args(args, "rerun")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, SUBSCRIBE_MAX_MESSAGE_BYTES)
    for topic in TOPICS:
        if not (args.no_preview and topic == "preview/"):
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    try:
        security.SocketSecurity(ctx, curve, "rerun").connect(sock, args.endpoint)
    except zmq.ZMQError as exc:
        sock.close()
        ctx.term()
        raise NpucamError(f"rerun: cannot connect to {args.endpoint}: {exc}") from None
    end = None if args.duration is None else time.monotonic() + args.duration
    received = bad = 0
    try:
        while args.count is None or received < args.count:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            if not sock.poll(None if left is None else max(1, int(left * 1000))):
                continue
            parts, _ = receive_bounded(sock, SUBSCRIBE_MAX_MESSAGE_BYTES)
            if parts is None:
                bad += 1
                continue
            try:
                logged = sink.log(wire.decode(parts))
            except (wire.WireError, KeyError, ValueError, TypeError) as exc:
                bad += 1
                print(f"npucam: skipped a message Rerun cannot take: {exc}", file=sys.stderr)
                continue
            received += logged
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        ctx.term()
        rec.flush()
        rec.disconnect()
    counts = ", ".join(f"{k} {n}" for k, n in sorted(sink.logged.items())) or "nothing"
    where = args.save or "the viewer"
    print(f"npucam: logged {counts} to {where}; {bad} skipped", file=sys.stderr)
    return 0
