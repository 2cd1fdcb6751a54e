import os, socket, struct, sys, threading, time, errno
IP = sys.argv[1]
def T(name, f):
    t0 = time.time()
    try: f(); r = "PASS"
    except AssertionError as e: r = f"FAIL {e}"
    except Exception as e: r = f"FAIL {type(e).__name__}: {e}"
    print(f"{r.split()[0]:5} {name} ({time.time()-t0:.1f}s) {'' if r=='PASS' else r}", flush=True)
def one_echo(port, size=20000):
    s = socket.create_connection((IP, port), timeout=45); d = os.urandom(size)
    s.sendall(d); got = bytearray()
    while len(got) < size:
        x = s.recv(65536)
        if not x: break
        got += x
    s.close(); assert bytes(got) == d, len(got)
def parallel(port, n):
    errs = []
    def w():
        try: one_echo(port)
        except Exception as e: errs.append(repr(e))
    ts = [threading.Thread(target=w) for _ in range(n)]
    for t in ts: t.start()
    for t in ts: t.join(90)
    assert not errs and not any(t.is_alive() for t in ts), (len(errs), errs[:3])
def reset_mid():
    s = socket.create_connection((IP, 8103), timeout=10)
    n = 0
    while n < (1 << 20):
        n += len(s.recv(65536))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); s.close()
    time.sleep(1)
def unread_close():
    s = socket.create_connection((IP, 8105), timeout=10)
    s.sendall(b"0123456789abcdef"); time.sleep(0.6)
    try:
        d = s.recv(10); raise AssertionError(f"got {d!r}, Linux sends RST (unread bytes)")
    except ConnectionResetError:
        pass
T("backlog 4, slow accept, 50 parallel clients", lambda: parallel(8101, 50))
T("4 threads in accept, 100 parallel clients", lambda: parallel(8102, 100))
T("client RST while server writes", reset_mid)
T("EPOLLEXCLUSIVE, 3 threads, 60 parallel", lambda: parallel(8104, 60))
T("server closes with unread bytes -> RST", unread_close)
