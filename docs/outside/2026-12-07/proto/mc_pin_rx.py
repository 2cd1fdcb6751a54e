#!/usr/bin/python3
"""N connections each send a `set` of 1,048,576 bytes but only the first 1,040,000
bytes of the value, then wait: the framer keeps each partial message (zero-copy slices of
the receive mbufs) until it completes. Meanwhile a fresh client tries `version`.
Usage: mc_pin_rx.py HOST PORT N HOLD_SECS"""
import socket, sys, time
host, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
conns = []
for i in range(n):
    c = socket.create_connection((host, port), timeout=5)
    c.sendall(b"set pin%d 0 0 1048576\r\n" % i)
    try:
        c.sendall(b"p" * 1_040_000)
    except OSError as e:
        print("conn", i, "send:", e)
    conns.append(c)
    print("conn", i, "sent", flush=True)
def probe():
    try:
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b"version\r\n")
        return s.recv(100)
    except OSError as e:
        return repr(e)
end = time.time() + hold
while time.time() < end:
    print("fresh client:", probe(), flush=True)
    time.sleep(3)
for c in conns:
    c.close()
time.sleep(2)
print("after closing:", probe())
