#!/usr/bin/env python3
"""Regenerate the committed seed corpus in seeds/<target>/ (plain Python, no scapy).

Each seed is a small, well-formed (or deliberately malformed) packet for one fuzz target,
with correct checksums, so the fuzzer starts past the checksum and length checks.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def csum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


SRC = bytes([198, 18, 0, 1])
DST = bytes([198, 18, 0, 2])
MAC_A = bytes([0x52, 0x54, 0, 0x12, 0x34, 0x56])
MAC_B = bytes([0x52, 0x54, 0, 0xAB, 0xCD, 0xEF])


def ipv4(proto, payload, ihl_opts=b"", flags_off=0x4000, ttl=64, tos=0, ident=0x1C46):
    hlen = 20 + len(ihl_opts)
    h = struct.pack("!BBHHHBBH4s4s", 0x40 | hlen // 4, tos, hlen + len(payload), ident,
                    flags_off, ttl, proto, 0, SRC, DST) + ihl_opts
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    return h + payload


def tcp(flags, opts=b"", payload=b"", seq=0x3ADE68B1, ack=0, win=64240, sport=40000, dport=80):
    while len(opts) % 4:
        opts += b"\0"
    hlen = 20 + len(opts)
    h = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, (hlen // 4) << 4, flags, win, 0, 0)
    seg = h + opts + payload
    ph = SRC + DST + struct.pack("!BBH", 0, 6, len(seg))
    c = csum(ph + seg)
    return seg[:16] + struct.pack("!H", c) + seg[18:]


def udp(payload, sport=5353, dport=53):
    seg = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    ph = SRC + DST + struct.pack("!BBH", 0, 17, len(seg))
    c = csum(ph + seg) or 0xFFFF
    return seg[:6] + struct.pack("!H", c) + seg[8:]


def icmp(t, code, rest, data):
    m = struct.pack("!BBH", t, code, 0) + rest + data
    return m[:2] + struct.pack("!H", csum(m)) + m[4:]


def eth(ethertype, payload, dst=MAC_B, src=MAC_A):
    return dst + src + struct.pack("!H", ethertype) + payload


def arp(op, tha=bytes(6)):
    return struct.pack("!HHBBH", 1, 0x0800, 6, 4, op) + MAC_A + SRC + tha + DST


TS = lambda v, e: struct.pack("!BBII", 8, 10, v, e)
SYN_OPTS = struct.pack("!BBH", 2, 4, 1460) + b"\x04\x02" + TS(0xA1B2C3, 0) + b"\x01\x03\x03\x07"
ACK_TS = b"\x01\x01" + TS(1000, 2000)
SACK2 = b"\x01\x01\x05\x12" + struct.pack("!IIII", 100, 200, 300, 400)

syn = tcp(0x02, SYN_OPTS)
data_seg = tcp(0x18, ACK_TS, b"GET / HTTP/1.1\r\n\r\n", ack=1)
sack_seg = tcp(0x10, ACK_TS + SACK2, ack=1)
echo = icmp(8, 0, struct.pack("!HH", 0x1234, 1), b"abcdefgh")
quoted = ipv4(6, syn)[:28]
frag_needed = icmp(3, 4, struct.pack("!HH", 0, 1400), quoted)
time_exceeded = icmp(11, 0, bytes(4), quoted)

SEEDS = {
    "ethernet": {
        "arp-request": eth(0x0806, arp(1), dst=b"\xff" * 6),
        "ipv4-syn": eth(0x0800, ipv4(6, syn)),
        "vlan-tagged": eth(0x8100, b"\x00\x64\x08\x00" + ipv4(6, syn)),
        "ipv6-ethertype": eth(0x86DD, bytes(40)),
    },
    "arp": {
        "request": arp(1),
        "reply": arp(2, MAC_B),
        "request-padded": arp(1) + bytes(18),
        "rarp": arp(3),
    },
    "ipv4": {
        "tcp-syn": ipv4(6, syn),
        "udp": ipv4(17, udp(b"luna!")),
        "with-options": ipv4(6, syn, ihl_opts=b"\x01\x01\x01\x00"),
        "first-fragment": ipv4(17, udp(b"x" * 24), flags_off=0x2000),
        "later-fragment": ipv4(17, b"y" * 16, flags_off=0x0003),
        "padded": ipv4(6, tcp(0x10, ack=1)) + bytes(6),
        "dscp-ecn": ipv4(6, syn, tos=(46 << 2) | 2),
    },
    "icmpv4": {
        "echo-request": echo,
        "echo-reply": icmp(0, 0, struct.pack("!HH", 0x1234, 1), b"abcdefgh"),
        "frag-needed": frag_needed,
        "time-exceeded": time_exceeded,
        "port-unreachable": icmp(3, 3, bytes(4), ipv4(17, udp(b"q"))[:28]),
        "redirect": icmp(5, 1, DST, quoted),
    },
    "tcp": {
        "syn": SRC + DST + syn,
        "data-ts": SRC + DST + data_seg,
        "sack": SRC + DST + sack_seg,
        "bare-ack": SRC + DST + tcp(0x10, ack=1),
        "zero-length-option": SRC + DST + tcp(0x02, b"\x1e\x00\x01\x01"),
        "bad-sack-length": SRC + DST + tcp(0x10, b"\x01\x01\x05\x0b" + bytes(9)),
        "unknown-option": SRC + DST + tcp(0x02, b"\x63\x04\xde\xad\x02\x04\x05\xb4"),
    },
    "udp": {
        "dns": SRC + DST + udp(b"luna!"),
        "no-checksum": SRC + DST + struct.pack("!HHHH", 1, 2, 9, 0) + b"z",
        "empty": SRC + DST + udp(b""),
    },
    "frame": {
        "syn": eth(0x0800, ipv4(6, syn)),
        "data": eth(0x0800, ipv4(6, data_seg)),
        "udp": eth(0x0800, ipv4(17, udp(b"luna!"))),
        "icmp-frag-needed": eth(0x0800, ipv4(1, frag_needed)),
        "arp": eth(0x0806, arp(1) + bytes(18), dst=b"\xff" * 6),
        "padded-ack": eth(0x0800, ipv4(6, tcp(0x10, ack=1)) + bytes(6)),
    },
}

# --- Scripts for the stack_listen / stack_established targets (format: stack_harness.rs).
def op_seg(flags, seq=0, ack=0, win=1024, mask=0, extra=b"", payload=0, port=None):
    """A TCP segment op: deltas are relative to the tracked peer/stack sequence numbers."""
    b = struct.pack("!BBhhHB", 1, flags, seq, ack, win, mask) + extra + struct.pack("!H", payload)
    if port is not None:
        b += struct.pack("!H", port)
    return b


def op_time(ms, shift=0):
    return struct.pack("!BBB", 5, ms, shift)


def op_app(what, n=0):
    return struct.pack("!BBH", 6, what, n)


def op_app1(what):
    """An application op that reads no more input (recv all, hold, release)."""
    return struct.pack("!BB", 6, what)


def op_raw(frame):
    return struct.pack("!BH", 0, len(frame)) + frame


def op_syns(n):
    return struct.pack("!BB", 7, n)


ACK, PSH, FIN, RST, SYN = 0x10, 0x08, 0x01, 0x04, 0x02
SYN_MASK = 1 | 2 | 4  # mss, wscale, sack-permitted
SEEDS["stack_listen"] = {
    "syn-then-ack": op_seg(SYN, mask=SYN_MASK, extra=struct.pack("!HB", 1460, 7))
    + op_seg(ACK, ack=0) + op_seg(ACK | PSH, payload=500) + op_app(0),
    "syn-burst-cookies": op_syns(40) + op_time(200) + op_syns(10),
    "rst-and-bare-ack": op_seg(RST, mask=64, port=1234) + op_seg(ACK, port=1235, mask=64),
    "arp-and-ping": op_raw(eth(0x0806, arp(1), dst=b"\xff" * 6, src=MAC_B))
    + op_raw(eth(0x0800, ipv4(1, echo), src=MAC_B)),
    "syn-timeouts": op_seg(SYN) + op_time(255, 4) + op_time(255, 6),
}
SEEDS["stack_established"] = {
    "in-order-data": op_seg(ACK | PSH, payload=1000) + op_seg(ACK | PSH, payload=1000) + op_app(0),
    "out-of-order": op_seg(ACK | PSH, seq=3000, payload=1000) + op_seg(ACK | PSH, payload=3000),
    "dupacks-sack": op_seg(ACK, mask=16, extra=struct.pack("!BhHhH", 2, 1448, 1448, 4344, 1448)) * 4,
    "ack-all": op_seg(ACK, ack=20000, win=4096) + op_app(1, 30000) + op_seg(ACK, ack=32000),
    "fin-and-close": op_seg(ACK | FIN, payload=10) + op_app(2) + op_time(100, 4),
    "rst-in-window": op_seg(RST, seq=100) + op_seg(RST),
    "zero-window": op_seg(ACK, win=0) + op_time(255, 2) + op_time(255, 5) + op_seg(ACK, win=500),
    "paws-old-ts": op_seg(ACK | PSH, mask=8, extra=struct.pack("!hI", -5000, 0), payload=100),
    "syn-in-window": op_seg(SYN, seq=10),
    "abort": op_app(3) + op_seg(ACK | PSH, payload=10),
    # r2c's split burst: ACKs held over the first half's output, the second half's input,
    # a read and a reply, then released.
    "held-acks": op_seg(ACK | PSH, payload=1448) + op_seg(ACK | PSH, payload=1448)
    + op_app1(5) + op_seg(ACK | PSH, payload=1448) + op_app1(0)
    + op_app(1, 100) + b"\x00" + op_app1(6),
}


if __name__ == "__main__":
    for target, seeds in SEEDS.items():
        d = os.path.join(HERE, "seeds", target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
    print(sum(len(s) for s in SEEDS.values()), "seeds written")
