"""Subscription limits of the publish socket: the size of one subscription, how many one peer
may hold and how many all peers may hold together; a peer that goes over is disconnected.

libzmq's XPUB stores every subscription in a trie of about 47 bytes per topic byte (a 1 MiB
subscription cost the publisher ~50-120 MB) and has no limit of its own. ZMQ_MAXMSGSIZE on the
socket makes libzmq's decoder drop a peer whose frame is longer than max_bytes plus
HANDSHAKE_ROOM (the frame limit also applies to the ZMTP handshake and to CURVE's encrypted
frames, so it cannot be max_bytes itself). Everything else is checked right after libzmq has
stored a subscription: every notification XPUB_VERBOSE / XPUB_VERBOSER hands up carries its
connection's file descriptor (ZMQ_SRCFD); a connection whose subscription is longer than
max_bytes, or that holds more than its share, is shut down (shutdown(2) on that descriptor,
once it is confirmed to be a connection accepted on this socket's address), and libzmq then
drops the connection's pipe and with it every subscription it held. What a peer adds before
that is what libzmq has already taken from it (kept small: RCVHWM, RCVBUF) plus what it reads
until the next drain; the publish stage drains after every send and every
SUBSCRIPTION_DRAIN_S (stages/publish.py). A libzmq SUB is cut within a few hundred; a raw
client that floods over many short connections gets more in (docs/reliability.md). The
socket monitor's DISCONNECTED events end a connection's count.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger(__name__)

NOBLOCK = int(zmq.NOBLOCK)
POLLIN = int(zmq.POLLIN)
# Frame bytes beside a subscription's topic: a ZMTP 3.1 SUBSCRIBE command's name (10), CURVE's
# MESSAGE box (33), and room for the handshake's INITIATE / READY with their metadata.
HANDSHAKE_ROOM = 1024
# Subscription messages libzmq queues per connection before it reads the socket further, and
# the kernel's receive buffer of each connection (SO_RCVBUF; Linux doubles it): what a cut
# connection still delivers after shutdown(2) is what these hold.
RCVHWM = 64
RCVBUF = 4096
# Notifications read per drain: a flood must not hold the event loop (the rest wait for the
# next drain, a send or SUBSCRIPTION_DRAIN_S later).
MAX_DRAIN = 8192
CUT_S = 1.0  # longest a cut connection's late notifications are ignored
LOGGED_DISCONNECTS = 5  # logged one by one, then one line per 100


@dataclass(frozen=True, slots=True)
class SubscriptionLimits:
    """max_bytes: of one subscription's topic; per_peer: subscriptions one connection may
    hold; total: all connections together."""

    max_bytes: int
    per_peer: int
    total: int


class SubscriptionGuard:
    """Reads an XPUB socket's subscription notifications and enforces SubscriptionLimits.

    Set up with the socket before it binds (configure()), then attach() once it is bound;
    drain() from the socket's thread only.
    """

    def __init__(self, limits: SubscriptionLimits, name: str) -> None:
        self.limits = limits
        self.name = name
        self.held: Counter[int] = Counter()  # connection fd -> subscriptions it holds
        self.total = 0
        self.disconnected = 0  # peers disconnected for going over a limit
        # fd -> (monotonic deadline, peer address): connections shut down, whose notifications
        # still being read are not to be counted again; libzmq's DISCONNECTED ends the entry,
        # and so does the descriptor carrying another peer (reused by a new connection). The
        # deadline only guards against an event that raced the shutdown.
        self._cut: dict[int, tuple[float, object]] = {}
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._address: tuple[int, object] | None = None

    def configure(self, sock: zmq.Socket) -> None:
        """Socket options every subscription passes through (before bind)."""
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, even a repeated topic
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # and every unsubscription
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_bytes + HANDSHAKE_ROOM)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.RCVBUF, RCVBUF)

    def attach(self, sock: zmq.Socket, monitor: zmq.Socket, endpoint: str) -> None:
        """Start reading sock (a synchronous view of the bound XPUB) and its monitor (a PAIR
        socket connected to sock.monitor(..., EVENT_DISCONNECTED)); endpoint: where it bound
        (LAST_ENDPOINT)."""
        self._sock = sock
        self._monitor = monitor
        self._address = _local_address(endpoint)

    def gauges(self) -> dict[str, float]:
        return {"subscriptions": self.total, "subscribers_disconnected": self.disconnected}

    def drain(self, notice: Callable[[bytes], None] = lambda event: None) -> tuple[int, int]:
        """Read the waiting notifications, at most MAX_DRAIN, handing each one from a
        connection not cut to notice(event) (byte 1 subscribe / 0 unsubscribe, then the
        topic prefix): (notifications read, subscriptions among them)."""
        self._forget_closed()
        read = subscribed = 0
        sock = self._sock
        while read < MAX_DRAIN and sock.getsockopt(zmq.EVENTS) & POLLIN:
            try:
                frame = sock.recv(NOBLOCK, copy=False)
            except zmq.Again:
                break
            read += 1
            subscribe = frame.bytes[:1] == b"\x01"
            subscribed += subscribe
            try:
                fd = frame.get(zmq.SRCFD)
            except zmq.ZMQError:
                # libzmq's own unsubscriptions when a connection ends; inproc peers
                notice(frame.bytes)
                continue
            if fd in self._cut:
                deadline, peer = self._cut[fd]
                if time.monotonic() < deadline and _peer(fd) in (peer, None):
                    continue  # sent before the connection was cut
                del self._cut[fd]
            notice(frame.bytes)
            if subscribe:
                self.held[fd] += 1
                self.total += 1
                if len(frame) - 1 > self.limits.max_bytes:
                    self._disconnect(fd, frame, "max_subscription_bytes", self.limits.max_bytes)
                elif self.held[fd] > self.limits.per_peer:
                    self._disconnect(fd, frame, "max_subscriptions_per_peer", self.limits.per_peer)
                elif self.total > self.limits.total:
                    self._disconnect(fd, frame, "max_subscriptions", self.limits.total)
            elif self.held[fd] > 0:
                self.held[fd] -= 1
                self.total -= 1
        return read, subscribed

    def _forget_closed(self) -> None:
        # EVENTS first: a recv that finds nothing raises zmq.Again, several microseconds a
        # call, and this runs after every publish send.
        while self._monitor.getsockopt(zmq.EVENTS) & POLLIN:
            try:
                event = recv_monitor_message(self._monitor, NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                fd = int(event["value"])
                self.total -= self.held.pop(fd, 0)
                self._cut.pop(fd, None)

    def _disconnect(self, fd: int, frame: zmq.Frame, key: str, limit: int) -> None:
        self.total -= self.held.pop(fd, 0)
        peer = _peer(fd)
        if not _shut_down(fd, self._address):
            return  # already closed
        self._cut[fd] = (time.monotonic() + CUT_S, peer)
        self.disconnected += 1
        n = self.disconnected
        if n <= LOGGED_DISCONNECTS or n % 100 == 0:
            try:
                peer = frame.get("Peer-Address")
            except zmq.ZMQError:
                peer = "?"
            log.warning(
                "publish %s: peer %s holds more subscriptions than %s (%d): disconnected "
                "(%d peer(s) so far)",
                self.name,
                peer,
                key,
                limit,
                n,
            )

    def close(self) -> None:
        if self._monitor is not None:
            self._monitor.close(0)
            self._monitor = None


def _local_address(endpoint: str) -> tuple[int, object] | None:
    """(address family, what getsockname gives for a connection accepted on it): the port for
    tcp, the path for ipc; None for transports without descriptors."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "tcp":
        return socket.AF_INET, int(rest.rpartition(":")[2])
    if scheme == "ipc":
        return socket.AF_UNIX, rest
    return None


def _peer(fd: int) -> object | None:
    """The peer address of the socket on fd (None if fd is closed or not a socket)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        conn = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    try:
        return conn.getpeername()
    except OSError:
        return None
    finally:
        conn.close()


def _shut_down(fd: int, address: tuple[int, object] | None) -> bool:
    """shutdown(2) the connection on fd if it is one accepted on address; True if done."""
    if address is None:
        return False
    try:
        dup = os.dup(fd)
    except OSError:
        return False  # closed meanwhile
    try:
        conn = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return False  # not a socket (the descriptor was reused)
    try:
        local = conn.getsockname()
        family, where = address
        ours = (
            local == where
            if family == socket.AF_UNIX
            else conn.family in (socket.AF_INET, socket.AF_INET6) and local[1] == where
        )
        if ours:
            conn.shutdown(socket.SHUT_RDWR)
        return ours
    except OSError:
        return False
    finally:
        conn.close()
