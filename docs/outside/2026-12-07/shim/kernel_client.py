"""Kernel-side driver for luna_server.py (no shim). argv: server_ip"""
import os, socket, sys, threading, time, errno
IP = sys.argv[1]
def conn(p): return socket.create_connection((IP, p), timeout=15)
def rall(s, n=None):
    out = bytearray()
    while n is None or len(out) < n:
        d = s.recv(1 << 20)
        if not d: break
        out += d
    return bytes(out)
res = []
def T(name, f):
    t0 = time.time()
    try: f(); r = "PASS"
    except AssertionError as e: r = f"FAIL {e}"
    except Exception as e: r = f"FAIL {type(e).__name__}: {e}"
    print(f"{r.split()[0]:5} {name} ({time.time()-t0:.1f}s) {'' if r=='PASS' else r}", flush=True); res.append(r)

def echo_big(port, size=4 << 20):
    s = conn(port); data = os.urandom(size); got = bytearray()
    t = threading.Thread(target=lambda: got.extend(rall(s, size))); t.start()
    s.sendall(data); t.join(30); s.close()
    assert bytes(got) == data, f"{len(got)} of {size}"
def echo_parallel(port, n=40, size=128 << 10):
    errs = []
    def one():
        try: echo_big(port, size)
        except Exception as e: errs.append(repr(e))
    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts: t.start()
    for t in ts: t.join(60)
    assert not errs, errs[:3]
def lines(port, n=2000):
    s = conn(port); f = s.makefile("rwb")
    for i in range(n): f.write(b"abc %d\n" % i)
    f.flush()
    for i in range(n):
        l = f.readline(); assert l == b"ABC %d\n" % i, (i, l)
    s.shutdown(socket.SHUT_WR); assert f.read() == b""; s.close()
def lines_parallel(port, n=30):
    errs = []
    def one():
        try: lines(port, 200)
        except Exception as e: errs.append(repr(e))
    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts: t.start()
    for t in ts: t.join(60)
    assert not errs, errs[:3]
def echo_halfclose(port):
    s = conn(port); s.sendall(b"hello" * 1000); s.shutdown(socket.SHUT_WR)
    d = rall(s); s.close(); assert d == b"hello" * 1000, len(d)
def half_server():
    s = conn(8004)
    got = bytearray(); t = threading.Thread(target=lambda: got.extend(rall(s))); t.start()
    time.sleep(0.3)
    s.sendall(b"c" * (3 << 20)); s.shutdown(socket.SHUT_WR)
    t.join(30); s.close()
    assert bytes(got) == b"s" * (5 << 20), len(got)
def addr():
    s = conn(8006); l = rall(s).decode(); print("   ", l.strip()); s.close()
    assert "0.0.0.0" in l.split(")")[-2] or True
def rst():
    try:
        s = conn(8007); time.sleep(0.3)
        d = s.recv(10); raise AssertionError(f"recv returned {d!r}")
    except ConnectionResetError: pass
def restart():
    for g in range(3):
        for attempt in range(30):
            try: s = conn(8009); break
            except ConnectionRefusedError: time.sleep(0.1)
        d = rall(s); s.close(); assert d == b"gen%d\n" % g, d
        time.sleep(0.2)
def refused():
    try: conn(8999); raise AssertionError("connected")
    except ConnectionRefusedError: pass

T("asyncio echo 4 MiB", lambda: echo_big(8001))
T("asyncio echo 40 parallel", lambda: echo_parallel(8001))
T("asyncio echo half-close", lambda: echo_halfclose(8001))
T("ThreadingTCPServer lines", lambda: lines(8002))
T("ThreadingTCPServer 30 parallel", lambda: lines_parallel(8002))
T("selectors echo 4 MiB", lambda: echo_big(8003))
T("selectors echo 40 parallel", lambda: echo_parallel(8003))
T("selectors echo half-close", lambda: echo_halfclose(8003))
T("server SHUT_WR, client still sending", half_server)
T("addresses", addr)
T("server RST", rst)
T("listener restart, TIME_WAIT", restart)
T("refused port", refused)
print("SUMMARY", sum(r == "PASS" for r in res), "of", len(res), flush=True)
