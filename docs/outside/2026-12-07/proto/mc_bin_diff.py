#!/usr/bin/python3
"""Binary-protocol differential test: luna-kv vs memcached 1.6, plus a pipelined
byte-by-byte split check. Usage: mc_bin_diff.py LUNA_HOST:PORT REF_HOST:PORT"""
import struct, sys, os, re
sys.path.insert(0, os.path.dirname(__file__))
from mc_diff import talk

RUN = os.urandom(3).hex().encode()

def req(op, key=b"", extras=b"", value=b"", opaque=0, cas=0, bodylen=None, keylen=None, extlen=None, dtype=0, vb=0):
    kl = len(key) if keylen is None else keylen
    el = len(extras) if extlen is None else extlen
    bl = len(key) + len(extras) + len(value) if bodylen is None else bodylen
    return struct.pack(">BBHBBHIIQ", 0x80, op, kl, el, dtype, vb, bl, opaque, cas) + extras + key + value

def parse(b):
    out = []
    while len(b) >= 24:
        magic, op, kl, el, dt, st, bl, opq, cas = struct.unpack(">BBHBBHIIQ", b[:24])
        body = b[24:24 + bl]
        out.append((hex(magic), hex(op), kl, el, hex(st), bl, hex(opq), "cas" if cas else 0, body))
        b = b[24 + bl:]
    if b:
        out.append(("trailing", b[:64]))
    return out

def K(n):
    return RUN + n

def cases():
    c = []
    setx = lambda k, v=b"v", fl=0, exp=0, op=0x01, opq=1, cas=0: req(op, k, struct.pack(">II", fl, exp), v, opq, cas)
    c.append(("quiet_get_miss_noop", [req(0x09, K(b"a"), opaque=11) + req(0x0d, K(b"b"), opaque=12) + req(0x0a, opaque=13)]))
    c.append(("setq_getkq_noop", [setx(K(b"c"), op=0x11, opq=21) + req(0x0d, K(b"c"), opaque=22) + req(0x0a, opaque=23)]))
    c.append(("unknown_opcode", [req(0x55, K(b"u"), value=b"xyz", opaque=31) + req(0x0a, opaque=32)]))
    c.append(("unknown_opcode_ff", [req(0xff, opaque=33) + req(0x0a, opaque=34)]))
    c.append(("sasl_list", [req(0x20, opaque=35) + req(0x0a, opaque=36)]))
    c.append(("bodylen_longer_than_sent", [req(0x00, K(b"d"), opaque=41, bodylen=len(K(b"d")) + 10)]))
    c.append(("bodylen_extra_on_get", [req(0x00, K(b"e"), value=b"junk", opaque=42) + req(0x0a, opaque=43)]))
    c.append(("get_with_extras", [req(0x00, K(b"e"), extras=b"\0\0\0\0", opaque=44) + req(0x0a, opaque=45)]))
    c.append(("incr_create", [req(0x05, K(b"i"), extras=struct.pack(">QQI", 5, 100, 0), opaque=51) + req(0x05, K(b"i"), extras=struct.pack(">QQI", 5, 100, 0), opaque=52)]))
    c.append(("incr_nocreate", [req(0x05, K(b"j"), extras=struct.pack(">QQI", 5, 100, 0xffffffff), opaque=53)]))
    c.append(("incrq_decrq_noop", [req(0x15, K(b"k"), extras=struct.pack(">QQI", 1, 7, 0), opaque=54) + req(0x16, K(b"k"), extras=struct.pack(">QQI", 100, 7, 0), opaque=55) + req(0x0c, K(b"k"), opaque=56)]))
    c.append(("touch_hit", [setx(K(b"t"), fl=0xdeadbeef) + req(0x1c, K(b"t"), extras=struct.pack(">I", 100), opaque=61)]))
    c.append(("touch_miss", [req(0x1c, K(b"tm"), extras=struct.pack(">I", 100), opaque=62)]))
    c.append(("gat_hit", [setx(K(b"g"), fl=7) + req(0x1d, K(b"g"), extras=struct.pack(">I", 100), opaque=63) + req(0x23, K(b"g"), extras=struct.pack(">I", 100), opaque=64)]))
    c.append(("gatq_miss_noop", [req(0x1e, K(b"gm"), extras=struct.pack(">I", 100), opaque=65) + req(0x24, K(b"gm"), extras=struct.pack(">I", 100), opaque=66) + req(0x0a, opaque=67)]))
    c.append(("deleteq_miss", [req(0x14, K(b"dm"), opaque=71) + req(0x0a, opaque=72)]))
    c.append(("delete_with_cas_mismatch", [setx(K(b"dc")) + req(0x04, K(b"dc"), opaque=73, cas=12345)]))
    c.append(("appendq_miss", [req(0x19, K(b"am"), value=b"x", opaque=74) + req(0x0a, opaque=75)]))
    c.append(("append_with_extras", [req(0x0e, K(b"ae"), extras=b"\0" * 8, value=b"x", opaque=76)]))
    c.append(("set_no_key", [req(0x01, b"", extras=b"\0" * 8, value=b"x", opaque=77)]))
    c.append(("set_bad_extras", [req(0x01, K(b"sb"), extras=b"\0" * 4, value=b"x", opaque=78)]))
    c.append(("replace_cas_mismatch", [setx(K(b"rc")) + req(0x03, K(b"rc"), extras=b"\0" * 8, value=b"y", opaque=79, cas=999999)]))
    c.append(("add_exists_q", [setx(K(b"ax")) + req(0x12, K(b"ax"), extras=b"\0" * 8, value=b"y", opaque=80) + req(0x0a, opaque=81)]))
    c.append(("version_with_key", [req(0x0b, K(b"v"), opaque=82)]))
    c.append(("noop_with_body", [req(0x0a, value=b"abc", opaque=83)]))
    c.append(("flush_with_extras", [req(0x08, extras=b"\0\0\0\0", opaque=84) + req(0x0a, opaque=85)]))
    c.append(("flushq", [req(0x18, opaque=86) + req(0x0a, opaque=87)]))
    c.append(("verbosity_noextras", [req(0x1b, opaque=88)]))
    c.append(("quitq_then_more", [req(0x17, opaque=89) + req(0x0a, opaque=90)]))
    c.append(("quit_then_more", [req(0x07, opaque=91) + req(0x0a, opaque=92)]))
    c.append(("stat_group", [req(0x10, b"settings", opaque=93)]))
    c.append(("nonzero_datatype", [req(0x0a, opaque=94, dtype=1)]))
    c.append(("extlen_255", [req(0x00, K(b"x"), opaque=95, extlen=255, bodylen=255 + len(K(b"x")))+ b"\0" * 255]))
    c.append(("getk_miss", [req(0x0c, K(b"gk"), opaque=96)]))
    c.append(("set_then_text", [setx(K(b"st")) + b"get " + K(b"st") + b"\r\n"]))
    c.append(("text_then_binary", [b"get " + K(b"tt") + b"\r\n" + req(0x0a, opaque=97)]))
    return c

def show(rep):
    data, closed = rep
    return parse(data), closed

def norm(p):
    return [tuple(x if i != 8 or not isinstance(x, bytes) else re.sub(rb"\d{6,}", b"N", x) for i, x in enumerate(t)) for t in p[0]], p[1]

def main():
    luna, ref = sys.argv[1], sys.argv[2]
    nd = 0
    for name, chunks in cases():
        a = show(talk(luna, chunks)); b = show(talk(ref, chunks))
        if norm(a) != norm(b):
            nd += 1
            print(f"DIFF {name}\n  luna: {a}\n  ref : {b}")
        else:
            print("same", name)
    print("diffs:", nd)

if __name__ == "__main__":
    main()
