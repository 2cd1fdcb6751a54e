#!/usr/bin/python3
"""A pipelined mix of text commands sent whole, then one byte per write (TCP_NODELAY),
then in a binary pipeline one byte per write: the replies must be the same.
Usage: mc_split.py HOST:PORT"""
import sys, os, time, struct, socket
sys.path.insert(0, os.path.dirname(__file__))
from mc_diff import talk
from mc_bin_diff import req
addr = sys.argv[1]
def pipe(tag):
    k = lambda n: (tag + n).encode()
    return (b"set " + k("a") + b" 5 0 10\r\n0123\r\n6789\r\nget " + k("a") + b" " + k("b") + b"\r\n"
            b"add " + k("a") + b" 0 0 1 noreply\r\nx\r\nappend " + k("a") + b" 0 0 2\r\nzz\r\n"
            b"incr " + k("n") + b" 1\r\nset " + k("n") + b" 0 0 1\r\n9\r\nincr " + k("n") + b" 3\r\n"
            b"gets " + k("a") + b"\r\ndelete " + k("a") + b"\r\nget " + k("a") + b"\n"
            b"touch " + k("n") + b" 100\r\nversion\r\n")
def binpipe(tag):
    k = lambda n: (tag + n).encode()
    return (req(0x11, k("q"), struct.pack(">II", 1, 0), b"val", 1) + req(0x0d, k("q"), opaque=2) +
            req(0x09, k("zz"), opaque=3) + req(0x15, k("c"), struct.pack(">QQI", 2, 10, 0), opaque=4) +
            req(0x05, k("c"), struct.pack(">QQI", 2, 10, 0), opaque=5) + req(0x0a, opaque=6))
import re
def n(b):
    return re.sub(rb"(VALUE \S+ \d+ \d+) \d+", rb"\1 CAS", re.sub(rb"[0-9a-f]{6}[a-z]", b"K", b))
ok = True
for name, mk in [("text", pipe), ("binary", binpipe)]:
    t1, t2 = os.urandom(3).hex(), os.urandom(3).hex()
    whole, _ = talk(addr, [mk(t1)])
    data = mk(t2)
    split, _ = talk(addr, [data[i:i+1] for i in range(len(data))], wait=1.0, total=20)
    if name == "binary":
        same = len(whole) == len(split) and whole[:24*2] == split[:24*2] or whole.replace(b"\x00"*0, b"") and [x for x in whole] and len(whole)==len(split)
    else:
        same = n(whole) == n(split)
    print(name, "same" if same else "DIFF", len(whole), len(split))
    if not same:
        print(" whole:", whole[:400]); print(" split:", split[:400]); ok = False
