"""Under the shim: do descriptors leak? Counts /proc/self/fd around batches of connections."""
import os, socket, sys, time, threading, select
PEER = sys.argv[1]
def nfd(): return len(os.listdir("/proc/self/fd"))
def batch(name, f, n=100):
    f()  # warm-up (starts luna)
    time.sleep(0.5)
    before = nfd()
    for _ in range(n): f()
    time.sleep(1.0)
    after = nfd()
    print(f"{name:40} fds before {before} after {after} ({after-before:+d} for {n})", flush=True)
def echo_close():
    s = socket.create_connection((PEER, 9001)); s.sendall(b"x"); s.recv(1); s.close()
def peer_closes_first():
    s = socket.create_connection((PEER, 9002))
    while s.recv(1 << 20): pass
    s.close()
def peer_rst():
    s = socket.create_connection((PEER, 9003)); s.sendall(b"0123456789")
    try: s.recv(1)
    except OSError: pass
    s.close()
def refused():
    s = socket.socket()
    try: s.connect((PEER, 9999))
    except OSError: pass
    s.close()
def timeout_connect():
    s = socket.socket(); s.settimeout(0.05)
    try: s.connect((PEER.rsplit(".",1)[0] + ".77", 80))
    except OSError: pass
    s.close()
def close_unread():
    s = socket.create_connection((PEER, 9002)); time.sleep(0.01); s.close()
def dup_close():
    s = socket.create_connection((PEER, 9001)); d = os.dup(s.fileno()); s.close(); os.close(d)
def epoll_reg_close():
    s = socket.create_connection((PEER, 9001)); ep = select.epoll(); ep.register(s, select.EPOLLIN); s.close(); ep.close()
def listener():
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("0.0.0.0", 7300)); l.listen(4); l.close()
for name, f in [("echo then close", echo_close), ("peer closes first", peer_closes_first),
                ("peer RST", peer_rst), ("ECONNREFUSED", refused), ("connect timeout", timeout_connect),
                ("close with unread data", close_unread), ("dup + close both", dup_close),
                ("epoll registered then close", epoll_reg_close), ("listener bind/listen/close", listener)]:
    try:
        batch(name, f, 30 if f is timeout_connect else 100)
    except Exception as e:
        print(name, "ERROR", repr(e), flush=True)
print("DONE", flush=True)
os._exit(0)
