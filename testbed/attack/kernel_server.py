#!/usr/bin/python3
"""The attack suite's control server: the kernel's TCP instead of luna's
(ATTACK_SERVER=kernel make attack; docs/reliability.md, "Kernel control").

Runs in the veth topology's second namespace. Forces SYN cookies for every SYN
(net.ipv4.tcp_syncookies = 2, this namespace only) so the flood meets cookies as it meets
luna's with a full backlog, then answers knb echo RPCs (16-byte header `id u64 | len u32 |
flags u16 | magic u16`, the reply with the RESPONSE flag and the same payload) on every
connection, one thread each, until STOP_FILE exists (or a hard limit of 600 s). Then prints
`OK requests=... echoed=... errors=...` and the kernel's counters for the attack
(TcpExt SyncookiesSent/Recv/Failed, ListenOverflows/Drops, Tcp OutRsts, TcpExt
TCPChallengeACK) as deltas over the run.

usage: kernel_server.py PORT READY_FILE STOP_FILE
"""

import os
import socket
import struct
import sys
import threading
import time

MAGIC = 0x6E6B
HDR = struct.Struct("<QIHH")
MAX_PAYLOAD = 1 << 20


def snmp():
    """The kernel's TCP counters of this namespace, by `Group.Name`."""
    out = {}
    for path in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = open(path).read().splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            group, names = names.split(":", 1)
            _, values = values.split(":", 1)
            for n, v in zip(names.split(), values.split()):
                try:
                    out[f"{group}.{n}"] = int(v)
                except ValueError:
                    pass
    return out


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = self.echoed = self.errors = self.conns = 0


def recv_exact(c, n):
    buf = bytearray()
    while len(buf) < n:
        d = c.recv(n - len(buf))
        if not d:
            return None if not buf else bytes(buf)
        buf += d
    return bytes(buf)


def serve(c, st):
    try:
        while True:
            h = recv_exact(c, HDR.size)
            if h is None:
                break
            if len(h) < HDR.size:
                raise OSError("truncated header")
            i, n, _flags, magic = HDR.unpack(h)
            if magic != MAGIC or n > MAX_PAYLOAD:
                raise OSError(f"bad header magic {magic:#x} len {n}")
            body = recv_exact(c, n) if n else b""
            if body is None or len(body) < n:
                raise OSError("truncated payload")
            c.sendall(HDR.pack(i, n, 1, MAGIC) + body)
            with st.lock:
                st.requests += 1
                st.echoed += n
    except OSError:
        with st.lock:
            st.errors += 1
    finally:
        c.close()


def main():
    port, ready, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    # RFC 4987 §3.6 cookies for every SYN, as luna's with its backlog full.
    open("/proc/sys/net/ipv4/tcp_syncookies", "w").write("2\n")
    before = snmp()
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(128)
    ls.settimeout(0.1)
    st = Stats()
    open(ready, "w").write("open")
    end = time.time() + 600
    while not os.path.exists(stop) and time.time() < end:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            continue
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        st.conns += 1
        threading.Thread(target=serve, args=(c, st), daemon=True).start()
    ls.close()
    time.sleep(0.2)
    after = snmp()
    d = {k: after[k] - before.get(k, 0) for k in after}
    want = [
        ("cookies_sent", "TcpExt.SyncookiesSent"),
        ("cookies_accepted", "TcpExt.SyncookiesRecv"),
        ("cookies_failed", "TcpExt.SyncookiesFailed"),
        ("listen_overflows", "TcpExt.ListenOverflows"),
        ("listen_drops", "TcpExt.ListenDrops"),
        ("rsts_sent", "Tcp.OutRsts"),
        ("challenge_acks", "TcpExt.TCPChallengeACK"),
        ("in_errs", "Tcp.InErrs"),
    ]
    extra = " ".join(f"{name}={d.get(key, 0)}" for name, key in want)
    print(f"OK server=kernel conns={st.conns} requests={st.requests} echoed={st.echoed} "
          f"errors={st.errors} {extra}", flush=True)


if __name__ == "__main__":
    main()
