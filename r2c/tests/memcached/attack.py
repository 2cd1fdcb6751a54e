#!/usr/bin/python3
"""memcached attacks against luna-kv, each on its own connection, while a well-behaved
client on another connection keeps doing set/get pairs and checks every reply.

Usage: attack.py HOST PORT. Prints one `ATTACK <name> ok` line per attack, then
`LEGIT ok pairs=N` and `ATTACK-SUMMARY ok slow_sent=N`; exits 1 on the first wrong reply.
Bounded: every socket has a timeout, every loop a count.

Also a module: `configure(host, port)`, then `ATTACKS[name]()` runs one attack on new
connections and raises `AttackFailed` on a wrong reply (the protocol-attack benchmark,
r2c/tests/bench/attack_bench.py, repeats them).
"""
import os
import socket
import struct
import sys
import threading
import time

HOST, PORT = "127.0.0.1", 11211
T = 10
SLOW_SENT = 2000
failures = []


class AttackFailed(Exception):
    """A reply that was not what the defence promises."""


def configure(host, port):
    global HOST, PORT
    HOST, PORT = host, port


def conn():
    c = socket.create_connection((HOST, PORT), timeout=T)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def read_exact(c, n):
    buf = b""
    while len(buf) < n:
        d = c.recv(n - len(buf))
        if not d:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += d
    return buf


def read_line(c):
    buf = b""
    while not buf.endswith(b"\n"):
        d = c.recv(1)
        if not d:
            raise EOFError("closed in a line: %r" % buf)
        buf += d
        if len(buf) > 4096:
            raise ValueError("line too long")
    return buf


def closed(c):
    """True if the server closed (FIN or RST) without sending anything more."""
    try:
        d = c.recv(4096)
        return d == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def fin(c):
    """True if the server closed gracefully (FIN, no reset) without sending more."""
    try:
        return c.recv(4096) == b""
    except (ConnectionResetError, socket.timeout):
        return False


def expect(name, got, want):
    if got != want:
        failures.append(name)
        msg = "%s %s != %s" % (name, repr(got)[:200], repr(want)[:200])
        print("ATTACK-FAIL", msg)
        raise AttackFailed(msg)


def bin_req(opcode, key=b"", extras=b"", value=b"", opaque=0, bodylen=None, keylen=None):
    kl = len(key) if keylen is None else keylen
    bl = len(extras) + len(key) + len(value) if bodylen is None else bodylen
    return struct.pack(">BBHBBHIIQ", 0x80, opcode, kl, len(extras), 0, 0, bl, opaque, 0) + extras + key + value


def bin_resp(c):
    h = read_exact(c, 24)
    magic, op, kl, el, _dt, status, bl, opaque, cas = struct.unpack(">BBHBBHIIQ", h)
    body = read_exact(c, bl)
    return op, status, opaque, body


# ------------------------------------------------------------------ legit client
legit_pairs = 0
legit_stop = threading.Event()
legit_err = []


def legit():
    global legit_pairs
    try:
        c = conn()
        i = 0
        while not legit_stop.is_set() and i < 100000:
            v = (b"value-%d-" % i) * (1 + i % 50)
            c.sendall(b"set legit%d 7 0 %d\r\n%s\r\n" % (i % 64, len(v), v))
            expect("legit set", read_line(c), b"STORED\r\n")
            c.sendall(b"get legit%d\r\n" % (i % 64))
            expect("legit get header", read_line(c), b"VALUE legit%d 7 %d\r\n" % (i % 64, len(v)))
            expect("legit get data", read_exact(c, len(v) + 2), v + b"\r\n")
            expect("legit get end", read_line(c), b"END\r\n")
            legit_pairs += 1
            i += 1
        c.close()
    except BaseException as e:  # reported below
        legit_err.append(repr(e))



# ------------------------------------------------------------------ attacks
# 1. Binary body length below key + extras (CVE-2016-8704/5/6): EINVAL with the opaque
# echoed (as memcached), then closed; the request before it is answered first.
def attack_bin_bodylen_underflow():
    c = conn()
    c.sendall(bin_req(0x0A, opaque=4) + bin_req(0x01, keylen=10, extras=b"\0" * 8, bodylen=4, opaque=0x1234))
    op, status, opaque, _ = bin_resp(c)
    expect("bin noop before bad lengths", (op, status, opaque), (0x0A, 0, 4))
    op, status, opaque, body = bin_resp(c)
    expect("bodylen<key+extras EINVAL", (op, status, opaque, body), (0x01, 0x04, 0x1234, b"Invalid arguments"))
    expect("bodylen<key+extras closed (FIN)", fin(c), True)
    c.close()
    return ""


# 2. Binary keylen over 250: EINVAL, then closed.
def attack_bin_key_over_250():
    c = conn()
    c.sendall(bin_req(0x00, key=b"k" * 251, opaque=77))
    op, status, opaque, body = bin_resp(c)
    expect("bin key>250 EINVAL", (op, status, opaque), (0x00, 0x04, 77))
    expect("bin key>250 closed", closed(c), True)
    c.close()
    return ""


# 3. Binary huge body on a SET: E2BIG, opaque echoed (the value would be swallowed).
def attack_bin_huge_bodylen():
    c = conn()
    c.sendall(bin_req(0x01, key=b"huge", extras=b"\0" * 8, bodylen=0xFFFFFFF0, opaque=0xabcd))
    op, status, opaque, body = bin_resp(c)
    expect("bin huge set E2BIG", (op, status, opaque), (0x01, 0x03, 0xabcd))
    c.close()
    return ""


# 4. Binary: good requests then a bad magic in one write: the good ones are answered
# (their replies were still at workers when the garbage was framed), then FIN.
def attack_bin_bad_magic():
    c = conn()
    c.sendall(bin_req(0x0A, opaque=5) + bin_req(0x0B, opaque=6) + b"\x42" + b"\0" * 23)
    op, status, opaque, _ = bin_resp(c)
    expect("bin noop before garbage", (op, status, opaque), (0x0A, 0, 5))
    op, status, opaque, _ = bin_resp(c)
    expect("bin version before garbage", (op, status, opaque), (0x0B, 0, 6))
    expect("bin bad magic closed (FIN)", fin(c), True)
    c.close()
    return ""


# 5. Text: <bytes> out of range and negative: CLIENT_ERROR, no allocation, in sync.
def attack_text_bad_bytes():
    c = conn()
    for b in (b"-1", b"4294967296", b"99999999999999999999999"):
        c.sendall(b"set k 0 0 " + b + b"\r\n")
        expect("bad bytes " + b.decode(), read_line(c), b"CLIENT_ERROR bad command line format\r\n")
    c.sendall(b"version\r\n")
    expect("in sync after bad bytes", read_line(c).startswith(b"VERSION "), True)
    c.close()
    return ""


# 6. Text: a value above the cap: SERVER_ERROR, the value is swallowed, still in sync.
def attack_text_value_too_large():
    c = conn()
    n = 3 * 1024 * 1024
    c.sendall(b"set toolarge 0 0 %d\r\n" % n)
    expect("too large", read_line(c), b"SERVER_ERROR object too large for cache\r\n")
    chunk = b"z" * 65536
    sent = 0
    while sent < n:
        k = min(len(chunk), n - sent)
        c.sendall(chunk[:k])
        sent += k
    c.sendall(b"\r\nget toolarge\r\n")
    expect("swallowed then get", read_line(c), b"END\r\n")
    c.close()
    return ""


# 7. LF-only lines (CVE-2023-46853 class): handled as memcached does. A new key each run
# (deleted at the end), so a value left by an earlier run cannot stand in for this run's
# set: the get pipelined behind it must see it (memcached runs a connection's commands in
# order; luna's MS once let the get run first and answer END: the benchmark's
# lf_only_lines@normal timeout, docs/reliability.md).
lf_runs = 0


def attack_lf_only_lines():
    global lf_runs
    lf_runs += 1
    k = b"lf-%d-%d" % (os.getpid(), lf_runs)
    c = conn()
    c.sendall(b"set " + k + b" 3 0 2\nhi\r\nget " + k + b" nokey " + k + b"\n")
    expect("lf set", read_line(c), b"STORED\r\n")
    value = b"VALUE " + k + b" 3 2\r\n"
    expect("lf get 1", read_line(c), value)
    expect("lf get 1 data", read_exact(c, 4), b"hi\r\n")
    expect("lf get 2", read_line(c) + read_exact(c, 4), value + b"hi\r\n")
    expect("lf end", read_line(c), b"END\r\n")
    c.sendall(b"set lf2 0 0 2\nhi\nXget lf2\n")
    expect("lf data chunk", read_line(c), b"CLIENT_ERROR bad data chunk\r\n")
    expect("lf2 not stored", read_line(c), b"END\r\n")
    c.sendall(b"delete " + k + b"\n")
    expect("lf delete", read_line(c), b"DELETED\r\n")
    c.close()
    return ""


# 8. Keys over 250 bytes: CLIENT_ERROR; the set's data line is then a command (ERROR).
def attack_key_over_250():
    c = conn()
    k = b"k" * 251
    c.sendall(b"get a " + k + b"\r\n")
    expect("long key get", read_line(c), b"CLIENT_ERROR bad command line format\r\n")
    c.sendall(b"set " + k + b" 0 0 1\r\nx\r\n")
    expect("long key set", read_line(c), b"CLIENT_ERROR bad command line format\r\n")
    expect("data as command", read_line(c), b"ERROR\r\n")
    c.sendall(b"get " + b"k" * 250 + b"\r\n")
    expect("250-byte key ok", read_line(c), b"END\r\n")
    c.close()
    return ""


# 9. Huge multiget (a line with no end past the multiget cap): closed.
def attack_huge_multiget():
    c = conn()
    try:
        for _ in range(20):
            c.sendall(b"get" + b" k" * 4000)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        expect("huge multiget CLIENT_ERROR", read_line(c), b"CLIENT_ERROR line too long\r\n")
    except ConnectionResetError:
        pass  # lingering past its bounds (1 MiB discarded) resets: also a close
    expect("huge multiget closed", closed(c), True)
    c.close()
    return ""


# 10. A long junk line with no newline: closed.
def attack_long_line():
    c = conn()
    try:
        c.sendall(b"a" * 5000)
    except (BrokenPipeError, ConnectionResetError):
        pass
    expect("long line CLIENT_ERROR", read_line(c), b"CLIENT_ERROR line too long\r\n")
    expect("long line closed (FIN)", fin(c), True)
    c.close()
    return ""


# 10b. Valid pipelined requests, then a line with no end, all in one write: the valid
# ones are answered in order, then CLIENT_ERROR line too long, then FIN.
# (The set is answered before the pipeline: under MS one connection's requests run in
# parallel, so a get pipelined behind its set may run first.)
def attack_valid_then_long_line():
    c = conn()
    c.sendall(b"set pipe 5 0 3\r\nabc\r\n")
    expect("pipe set", read_line(c), b"STORED\r\n")
    c.sendall(b"get pipe\r\nincr nope 1\r\n" + b"a" * 5000)
    expect("pipe get", read_line(c) + read_exact(c, 5) + read_line(c), b"VALUE pipe 5 3\r\nabc\r\nEND\r\n")
    expect("pipe incr", read_line(c), b"NOT_FOUND\r\n")
    expect("pipe CLIENT_ERROR", read_line(c), b"CLIENT_ERROR line too long\r\n")
    expect("pipe closed (FIN)", fin(c), True)
    c.close()
    return ""


# 11. A large multiget within the caps is answered in full.
def attack_large_multiget_answered():
    c = conn()
    keys = [b"legit%d" % i for i in range(64)] * 30
    c.sendall(b"get " + b" ".join(keys) + b"\r\n")
    hits = 0
    while True:
        l = read_line(c)
        if l == b"END\r\n":
            break
        size = int(l.split()[3])
        read_exact(c, size + 2)
        hits += 1
    expect("multiget hits", hits > 0 and hits <= len(keys), True)
    c.close()
    return " hits=%d" % hits


# 12. A slow reader: a 1 MB value requested 2000 times and never read.
def attack_slow_reader():
    c = conn()
    c.sendall(b"set slowbig 0 0 1000000\r\n" + b"s" * 1000000 + b"\r\n")
    expect("slow set", read_line(c), b"STORED\r\n")
    # All in one write, so the server has them buffered before the first reply blocks.
    c.settimeout(5)
    c.sendall(b"get slowbig\r\n" * SLOW_SENT)
    time.sleep(2)
    c.close()
    return " sent=%d" % SLOW_SENT


ATTACKS = {
    name[len("attack_"):]: fn
    for name, fn in list(globals().items())
    if name.startswith("attack_") and callable(fn)
}


def main():
    configure(sys.argv[1], int(sys.argv[2]))
    lt = threading.Thread(target=legit)
    lt.start()
    time.sleep(0.3)
    try:
        for name, fn in ATTACKS.items():
            print("ATTACK %s ok%s" % (name, fn()))
    except Exception as e:  # AttackFailed (already printed) or a broken connection
        if not isinstance(e, AttackFailed):
            print("ATTACK-FAIL", repr(e))
        legit_stop.set()
        lt.join(30)
        sys.exit(1)
    time.sleep(0.5)
    legit_stop.set()
    lt.join(30)
    if legit_err or lt.is_alive():
        print("LEGIT-FAIL", legit_err)
        sys.exit(1)
    try:
        expect("legit made progress", legit_pairs > 10, True)
    except AttackFailed:
        sys.exit(1)
    print("LEGIT ok pairs=%d" % legit_pairs)
    print("ATTACK-SUMMARY ok slow_sent=%d" % SLOW_SENT)


if __name__ == "__main__":
    main()
