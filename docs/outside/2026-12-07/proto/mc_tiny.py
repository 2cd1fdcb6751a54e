#!/usr/bin/python3
"""N connections each send a `set` of SIZE bytes as 1-byte TCP segments (TCP_NODELAY,
one send per byte, a short pause every 64 bytes so each byte leaves on its own), all but
the last byte, then hold. A fresh client tries `version` and a set/get meanwhile.
Usage: mc_tiny.py HOST PORT N SIZE HOLD_SECS"""
import socket, sys, time
host, port, n, size, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
conns = []
for i in range(n):
    c = socket.create_connection((host, port), timeout=5)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"set tiny%d 0 0 %d\r\n" % (i, size))
    conns.append(c)
t0 = time.time()
for b in range(size - 1):
    for c in conns:
        c.send(b"t")
    if b % 64 == 63:
        time.sleep(0.0005)
print("sent %d x %d one-byte writes in %.1f s" % (n, size - 1, time.time() - t0), flush=True)
def probe():
    try:
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b"version\r\nset probe 0 0 2\r\nok\r\nget probe\r\n")
        time.sleep(0.3)
        return s.recv(200)
    except OSError as e:
        return repr(e)
end = time.time() + hold
while time.time() < end:
    print("fresh client:", probe(), flush=True)
    time.sleep(2)
for c in conns:
    c.send(b"t\r\n")
for i, c in enumerate(conns):
    c.settimeout(5)
    try:
        print("conn", i, c.recv(100), flush=True)
    except OSError as e:
        print("conn", i, repr(e), flush=True)
    c.close()
c = socket.create_connection((host, port), timeout=3)
c.sendall(b"get tiny0\r\n")
time.sleep(0.5)
r = c.recv(size + 100)
print("get tiny0:", len(r), "bytes", r[:40], flush=True)
