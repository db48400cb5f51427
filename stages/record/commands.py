"""`npucam replay SESSION`: a recording's published messages on a PUB socket again, byte for
byte and in order, at their recorded pace (or --speed times it, or --fast). Sends block at the
high-water mark (ZMQ_XPUB_NODROP): an offline replay waits for a slow subscriber instead of
dropping what it recorded. `npucam process SESSION --config CONFIG --out OUT`: the
full-fidelity pass over the recording, resumable (process.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading
from pathlib import Path

import zmq

from stages.record import process
from stages.record.replay import messages, replay, session_folder

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay", help="publish a recording's messages again (docs/recording.md)"
    )
    p.add_argument("session", help="a session folder written by a record stage")
    p.add_argument(
        "--bind", default="tcp://127.0.0.1:5560", help="PUB endpoint (tcp://127.0.0.1:* : free)"
    )
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=_positive, default=1.0, help="times the recorded pace")
    pace.add_argument("--fast", action="store_true", help="as fast as subscribers take them")
    p.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="PREFIX",
        help="only topics starting with PREFIX (repeatable; default: every topic)",
    )
    p.add_argument(
        "--wait-for-subscribers",
        type=int,
        default=1,
        metavar="N",
        help="start once N subscriptions arrived (default 1; 0: at once)",
    )
    p.add_argument("--sndhwm", type=int, default=1000, help="messages queued per subscriber")
    p.set_defaults(func=cmd_replay)

    p = subparsers.add_parser(
        "process",
        help="run a config over a recording, nothing dropped (docs/recording.md)",
    )
    p.add_argument("session", help="a session folder written by a record stage")
    p.add_argument("--config", required=True, type=Path, help="the pipeline config to run")
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        help="folder for the take (created; an interrupted pass in it is resumed)",
    )
    p.set_defaults(func=cmd_process)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def cmd_replay(args: argparse.Namespace) -> int:
    session = session_folder(args.session)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.SNDHWM, args.sndhwm)
    sock.setsockopt(zmq.XPUB_NODROP, 1)
    sock.setsockopt(zmq.LINGER, 2000)
    try:
        sock.bind(args.bind)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        print(f"replay: {session} on {endpoint}", flush=True)
        subscribed = 0
        while subscribed < args.wait_for_subscribers and not stop.is_set():
            if sock.poll(100, zmq.POLLIN):
                subscribed += sock.recv()[:1] == b"\x01"
        speed = None if args.fast else args.speed
        sent = replay(
            messages(session),
            lambda parts: _send(sock, parts, stop),
            stop,
            speed=speed,
            topics=tuple(args.topic),
        )
        print(f"replay: sent {sent} messages", flush=True)
    finally:
        sock.close()
        ctx.term()
    return 0


def cmd_process(args: argparse.Namespace) -> int:
    session = session_folder(args.session)
    jobs_after = process.resume_point(args.out, session, args.config)
    done = process.finished_summary(args.out)
    if done is not None:
        print(f"process: {args.out} already holds the whole take ({done})", flush=True)
        return 0 if process.lost(done) == 0 else 1
    if jobs_after:
        print(f"process: resuming {args.out} after {jobs_after}", flush=True)
    config = process.offline_config(args.config, session, args.out, jobs_after)
    code, summary, _ = asyncio.run(process.run_offline(config))
    print(
        f"process: {summary['frames_written']}/{summary['frames_recorded']} frames in "
        f"{args.out}, {summary['persons_posed']} persons posed, {summary['drops']} dropped"
        + "".join(
            f"; rig {rig}: {r['published']} groups, {r['timed_out']} without every pose, "
            f"{r['late_poses']} poses too late"
            for rig, r in summary["rigs"].items()
        )
        + ("" if summary["complete"] else " (stopped before the end: run again to resume)"),
        flush=True,
    )
    return code


def _send(sock: zmq.Socket, parts: list[bytes], stop: threading.Event) -> None:
    """Send a message, waiting at the high-water mark (in steps, to notice stop), and read
    the subscription notices XPUB queues meanwhile."""
    while not stop.is_set():
        try:
            sock.send_multipart(parts, zmq.NOBLOCK)
            break
        except zmq.Again:
            sock.poll(100, zmq.POLLOUT)
    while sock.poll(0, zmq.POLLIN):
        sock.recv()
