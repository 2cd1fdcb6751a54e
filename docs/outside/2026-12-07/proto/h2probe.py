#!/usr/bin/python3
"""Raw HTTP/2 frame probes against luna-h2 (hyperframe + hpack). Each probe runs on its
own connection and prints the frames the server sent (type, stream, flags, error code /
status) and whether it closed.  Usage: h2probe.py HOST PORT [probe...]"""
import socket, sys, time, struct
from hpack import Encoder, Decoder
from hyperframe.frame import (Frame, SettingsFrame, HeadersFrame, DataFrame, ContinuationFrame,
    RstStreamFrame, WindowUpdateFrame, PingFrame, GoAwayFrame, PriorityFrame)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HOST, PORT = sys.argv[1], int(sys.argv[2])

def raw(kind, flags, sid, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload

def hdrs(sid, block, es=True, eh=True, extra_flags=0, prefix=b""):
    fl = (1 if es else 0) | (4 if eh else 0) | extra_flags
    return raw(1, fl, sid, prefix + block)

def req(enc, path="/", method="GET", extra=()):
    return enc.encode([(":method", method), (":scheme", "http"), (":path", path), (":authority", HOST)] + list(extra))

def run(payloads, wait=1.5, settings=None, pause=0.0):
    s = socket.create_connection((HOST, PORT), timeout=10)
    sf = SettingsFrame(0)
    if settings:
        sf.settings = settings
    s.sendall(PREFACE + sf.serialize())
    for p in payloads:
        try:
            s.sendall(p)
        except OSError as e:
            break
        if pause:
            time.sleep(pause)
    buf = b""; closed = "open"
    s.settimeout(0.3)
    end = time.time() + wait
    while time.time() < end:
        try:
            d = s.recv(1 << 16)
        except socket.timeout:
            continue
        except ConnectionResetError:
            closed = "RST"; break
        if not d:
            closed = "FIN"; break
        buf += d
    s.close()
    dec = Decoder()
    out = []; at = 0
    while at + 9 <= len(buf):
        f, ln = Frame.parse_frame_header(memoryview(buf[at:at + 9]))
        if at + 9 + ln > len(buf):
            break
        f.parse_body(memoryview(buf[at + 9:at + 9 + ln]))
        n = type(f).__name__.replace("Frame", "")
        if isinstance(f, GoAwayFrame):
            out.append(f"GOAWAY(last={f.last_stream_id},code={f.error_code},{bytes(f.additional_data).decode()})")
        elif isinstance(f, RstStreamFrame):
            out.append(f"RST({f.stream_id},code={f.error_code})")
        elif isinstance(f, HeadersFrame):
            try:
                h = dec.decode(bytes(f.data))
            except Exception as e:
                h = [("hpack-error", str(e))]
            st = dict(h).get(":status", dict(h).get("grpc-status", "?"))
            out.append(f"HEADERS({f.stream_id},{st},{'ES' if 'END_STREAM' in f.flags else ''})")
        elif isinstance(f, DataFrame):
            out.append(f"DATA({f.stream_id},{len(f.data)}{',ES' if 'END_STREAM' in f.flags else ''})")
        elif n in ("Settings", "WindowUpdate", "Ping"):
            pass
        else:
            out.append(n)
        at += 9 + ln
    return out, closed

P = {}
def probe(fn):
    P[fn.__name__] = fn
    return fn

@probe
def decreasing_stream_id():
    """RFC 9113 §5.1.1: a new stream id not above every earlier one is a connection error
    PROTOCOL_ERROR. Stream 5 then stream 3 (new)."""
    e = Encoder()
    return run([hdrs(5, req(e)), hdrs(3, req(e))])

@probe
def reused_stream_id():
    """HEADERS on stream 1 again after it completed (closed): connection error STREAM_CLOSED / PROTOCOL_ERROR."""
    e = Encoder()
    return run([hdrs(1, req(e)), b"", hdrs(1, req(e))], pause=0.3)

@probe
def content_length_mismatch():
    """RFC 9113 §8.1.1: content-length not equal to the DATA length is malformed (stream PROTOCOL_ERROR)."""
    e = Encoder()
    return run([hdrs(1, req(e, "/echo", "POST", [("content-length", "10")]), es=False), raw(0, 1, 1, b"abc")])

@probe
def crlf_in_header_value():
    """RFC 9113 §8.2.1: a field value with NUL, CR or LF is malformed."""
    e = Encoder()
    return run([hdrs(1, req(e, "/", "GET", [("x-a", "1\r\nx-injected: 2")]))])

@probe
def nul_in_header_value():
    e = Encoder()
    return run([hdrs(1, req(e, "/", "GET", [("x-a", "1\x002")]))])

@probe
def space_in_header_name():
    e = Encoder()
    return run([hdrs(1, req(e, "/", "GET", [("x a", "1")]))])

@probe
def duplicate_authority():
    """RFC 9113 §8.3: a pseudo-header field MUST NOT appear more than once."""
    e = Encoder()
    return run([hdrs(1, req(e, "/", "GET", [])[:0] + e.encode([(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "a"), (":authority", "b")]))])

@probe
def connect_with_path():
    """RFC 9113 §8.5: CONNECT omits :scheme and :path (malformed otherwise)."""
    e = Encoder()
    return run([hdrs(1, e.encode([(":method", "CONNECT"), (":scheme", "http"), (":path", "/"), (":authority", "a:1")]))])

@probe
def connect_no_authority():
    e = Encoder()
    return run([hdrs(1, e.encode([(":method", "CONNECT")]))])

@probe
def self_dependency_headers():
    """RFC 9113 §5.3.1: a stream cannot depend on itself: stream error PROTOCOL_ERROR."""
    e = Encoder()
    return run([hdrs(1, req(e), extra_flags=0x20, prefix=struct.pack(">IB", 1, 15))])

@probe
def self_dependency_priority():
    e = Encoder()
    return run([raw(2, 0, 1, struct.pack(">IB", 1, 15)), hdrs(1, req(e))])

@probe
def data_on_even_idle_stream():
    e = Encoder()
    return run([hdrs(3, req(e)), raw(0, 1, 2, b"x")])

@probe
def window_update_closed_stream_flood():
    """WINDOW_UPDATEs on a closed stream cost no flood budget (docs: frames on closed streams cost one unit)."""
    e = Encoder()
    wu = raw(8, 0, 1, struct.pack(">I", 1)) * 20000
    return run([hdrs(1, req(e)), b""] + [wu] * 10, pause=0.01, wait=3)

@probe
def ping_ack_flood():
    """Unsolicited PING ACKs cost nothing."""
    pa = raw(6, 1, 0, b"\0" * 8) * 20000
    return run([pa] * 10, wait=3)

@probe
def settings_ack_flood():
    sa = raw(4, 1, 0, b"") * 20000
    return run([sa] * 10, wait=3)

@probe
def head_request():
    e = Encoder()
    return run([hdrs(1, req(e, "/big", "HEAD"))])

@probe
def trailers_ok():
    e = Encoder()
    return run([hdrs(1, req(e, "/echo", "POST"), es=False), raw(0, 0, 1, b"abc"), hdrs(1, e.encode([("x-trailer", "1")]))])

@probe
def table_size_update_mid_block():
    """RFC 7541 §4.2: a dynamic table size update after the first field is COMPRESSION_ERROR."""
    e = Encoder()
    blk = req(e) + b"\x3f\x01"  # size update to 32 after fields
    return run([hdrs(1, blk)])

@probe
def table_size_update_two():
    e = Encoder()
    blk = b"\x20\x3f\xe1\x1f" + req(e)  # 0 then 4096: allowed (two at the start)
    return run([hdrs(1, blk)])

@probe
def huge_hpack_index():
    blk = b"\xff\xff\xff\xff\xff\xff\x0f"  # indexed field with a huge index
    return run([hdrs(1, blk)])

@probe
def huge_hpack_string_len():
    blk = b"\x40\x7f\xff\xff\xff\xff\x0f" + b"a" * 100
    return run([hdrs(1, blk)])

@probe
def hpack_int_overlong():
    blk = b"\x40\x7f" + b"\x80" * 20 + b"\x00"
    return run([hdrs(1, blk)])

@probe
def padded_headers_with_priority_overrun():
    """PADDED+PRIORITY where padding leaves < 5 bytes: RFC says PROTOCOL_ERROR."""
    e = Encoder()
    # payload: padlen=3, then 4 bytes only -> after unpad 1 byte (<5 for priority)
    return run([raw(1, 0x4 | 0x1 | 0x8 | 0x20, 1, b"\x03" + b"\0\0\0\x00" + b"\0\0\0")])

@probe
def zero_window_then_settings_open():
    """INITIAL_WINDOW_SIZE 0, GET /big, then SETTINGS raises it: data must flow."""
    e = Encoder()
    return run([hdrs(1, req(e, "/big")), b"", raw(4, 0, 0, struct.pack(">HI", 4, 65535))], settings={4: 0}, pause=0.3, wait=2)

@probe
def window_shrink_negative():
    """Window made negative by a SETTINGS decrease mid-reply, then a stream WINDOW_UPDATE."""
    e = Encoder()
    return run([hdrs(1, req(e, "/big")), raw(4, 0, 0, struct.pack(">HI", 4, 0)), b"", raw(8, 0, 1, struct.pack(">I", 100000)), raw(8, 0, 0, struct.pack(">I", 100000))], settings={4: 1000}, pause=0.3, wait=2)

@probe
def goaway_then_new_stream():
    e = Encoder()
    return run([hdrs(1, req(e)), raw(7, 0, 0, struct.pack(">II", 1, 0)), hdrs(3, req(e))], wait=2)

@probe
def rst_idle_even():
    return run([raw(3, 0, 2, struct.pack(">I", 8))])

@probe
def max_frame_16m_big():
    e = Encoder()
    return run([hdrs(1, req(e, "/big"))], settings={5: 16777215, 4: 2**31 - 1})

@probe
def many_headers_130():
    """130 small fields (about 2 KB, well under the advertised MAX_HEADER_LIST_SIZE)."""
    e = Encoder()
    return run([hdrs(1, req(e, "/", "GET", [("x-h%d" % i, "v") for i in range(130)])), ])

@probe
def two_streams_one_with_130_headers():
    e = Encoder()
    return run([hdrs(1, req(e, "/big")), hdrs(3, req(e, "/", "GET", [("x-h%d" % i, "v") for i in range(130)]))])

@probe
def data_after_end_stream():
    e = Encoder()
    return run([hdrs(1, req(e, "/echo", "POST"), es=False), raw(0, 1, 1, b"a"), raw(0, 0, 1, b"b")])

@probe
def headers_no_end_headers_then_data():
    e = Encoder()
    return run([hdrs(1, req(e), eh=False), raw(0, 1, 1, b"a")])

@probe
def settings_unknown_and_huge_table():
    e = Encoder()
    return run([hdrs(1, req(e))], settings={1: 2**32 - 1, 0x99: 7, 6: 0})

@probe
def header_table_zero_then_requests():
    e = Encoder()
    return run([hdrs(1, req(e)), raw(4, 0, 0, struct.pack(">HI", 1, 0)), b"", hdrs(3, req(e)), hdrs(5, req(e))], pause=0.2)

if __name__ == "__main__":
    names = sys.argv[3:] or list(P)
    for n in names:
        t = time.time()
        out, closed = P[n]()
        print(f"{n}: {' '.join(out)} [{closed}] ({time.time()-t:.1f}s)")
