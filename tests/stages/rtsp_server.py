"""A controllable RTSP camera on 127.0.0.1: Motion-JPEG over RTP (RFC 2435), interleaved in
the RTSP TCP connection (RFC 2326 §10.12), with LoopbackCamera's stall/down/up faults.

It answers OPTIONS, DESCRIBE (SDP: one video track, static payload type 26 = JPEG/90000),
SETUP, PLAY, GET_PARAMETER and TEARDOWN. SETUP over UDP is refused with 461 Unsupported
Transport, which makes FFmpeg retry over TCP as RTSP clients do. Each card is split into RTP
packets of the JPEG scan data behind the 8-byte RTP/JPEG header; the first packet of a frame
also carries the quantisation tables (Q = 255), and the last one has the marker bit set.
"""

from __future__ import annotations

import socket
import struct

from mjpeg_server import LoopbackCamera

PAYLOAD_TYPE = 26  # JPEG (RFC 3551)
MAX_FRAGMENT = 1400
SSRC = 0x6E707563


def jpeg_parts(jpeg: bytes) -> tuple[bytes, bytes, int]:
    """(luma + chroma quantisation tables in DQT order, scan data, RTP/JPEG type) of a
    baseline JPEG as cv2.imencode writes it (standard Huffman tables, 4:2:0 or 4:2:2)."""
    tables: list[bytes] = []
    i, rtp_type = 2, None
    while i + 4 <= len(jpeg):
        marker = jpeg[i + 1]
        length = struct.unpack(">H", jpeg[i + 2 : i + 4])[0]
        segment = jpeg[i + 4 : i + 2 + length]
        if marker == 0xDB:  # DQT: one or more [Pq|Tq, 64 bytes]
            for k in range(0, len(segment), 65):
                tables.append(segment[k + 1 : k + 65])
        elif marker == 0xC0:  # SOF0: Y sampling 2x2 = type 1 (4:2:0), 2x1 = type 0 (4:2:2)
            rtp_type = 1 if segment[7] == 0x22 else 0
        elif marker == 0xDA:  # SOS: the scan runs to the EOI marker
            return b"".join(tables[:2]), jpeg[i + 2 + length : -2], rtp_type
        i += 2 + length
    raise ValueError("not a baseline JPEG")


def rtp_jpeg_packets(jpeg: bytes, width: int, height: int, seq: int, timestamp: int) -> list[bytes]:
    """RTP packets (RFC 3550 header + RFC 2435 payload) of one JPEG frame."""
    tables, scan, rtp_type = jpeg_parts(jpeg)
    packets = []
    offset = 0
    while offset < len(scan):
        chunk = scan[offset : offset + MAX_FRAGMENT]
        last = offset + len(chunk) >= len(scan)
        header = struct.pack(
            ">BBHII",
            0x80,
            (0x80 if last else 0) | PAYLOAD_TYPE,
            (seq + len(packets)) & 0xFFFF,
            timestamp & 0xFFFFFFFF,
            SSRC,
        )
        jpeg_header = struct.pack(">I", offset)[1:]  # 24-bit fragment offset
        jpeg_header = b"\x00" + jpeg_header + bytes([rtp_type, 255, width // 8, height // 8])
        if offset == 0:
            jpeg_header += struct.pack(">BBH", 0, 0, len(tables)) + tables
        packets.append(header + jpeg_header + chunk)
        offset += len(chunk)
    return packets


class RtspServer(LoopbackCamera):
    """Serves the test cards at rtsp://127.0.0.1:port/video (width, height multiples of 8)."""

    scheme = "rtsp"

    def serve(self, conn: socket.socket) -> None:
        buffer = bytearray()
        session = "5713"
        while True:
            self._skip_interleaved(conn, buffer)
            head = self.read_request(conn, buffer)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method = lines[0].split(" ")[0]
            headers = {}
            for line in lines[1:]:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            cseq = headers.get("cseq", "0")
            extra, body = "", b""
            status = "200 OK"
            if method == "OPTIONS":
                extra = "Public: OPTIONS, DESCRIBE, SETUP, PLAY, GET_PARAMETER, TEARDOWN\r\n"
            elif method == "DESCRIBE":
                body = (
                    "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=npucam test card\r\n"
                    "c=IN IP4 0.0.0.0\r\nt=0 0\r\n"
                    f"m=video 0 RTP/AVP {PAYLOAD_TYPE}\r\n"
                    f"a=rtpmap:{PAYLOAD_TYPE} JPEG/90000\r\na=control:track0\r\n"
                ).encode()
                extra = (
                    f"Content-Base: {self.url}/\r\nContent-Type: application/sdp\r\n"
                    f"Content-Length: {len(body)}\r\n"
                )
            elif method == "SETUP":
                transport = headers.get("transport", "")
                if "RTP/AVP/TCP" not in transport:
                    status = "461 Unsupported Transport"
                else:
                    extra = (
                        f"Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\nSession: {session}\r\n"
                    )
            elif method == "PLAY":
                extra = f"Session: {session}\r\nRange: npt=0.000-\r\n"
            elif method == "TEARDOWN":
                conn.sendall(f"RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n\r\n".encode())
                return
            elif method != "GET_PARAMETER":
                status = "501 Not Implemented"
            conn.sendall(f"RTSP/1.0 {status}\r\nCSeq: {cseq}\r\n{extra}\r\n".encode() + body)
            if method == "PLAY":
                self._stream(conn)
                return

    def _stream(self, conn: socket.socket) -> None:
        seq = 0
        for n, jpeg in enumerate(self.cards()):
            timestamp = int(n * 90000 / self.fps)
            try:
                packets = rtp_jpeg_packets(jpeg, self.width, self.height, seq, timestamp)
            except ValueError:
                continue  # a corrupt card (corrupt_every) is a lost frame on RTP
            seq += len(packets)
            conn.sendall(b"".join(b"$\x00" + struct.pack(">H", len(p)) + p for p in packets))

    def _skip_interleaved(self, conn: socket.socket, buffer: bytearray) -> None:
        """Drop RTCP the client interleaves ('$', channel, 16-bit length, data)."""
        while buffer[:1] == b"$":
            while len(buffer) < 4 or len(buffer) < 4 + struct.unpack(">H", buffer[2:4])[0]:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buffer += chunk
            del buffer[: 4 + struct.unpack(">H", buffer[2:4])[0]]
