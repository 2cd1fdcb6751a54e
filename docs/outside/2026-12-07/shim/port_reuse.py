"""Each luna process picks the same ephemeral ports: a second run within 60 s meets the
kernel peer's TIME_WAIT of the first (the peer, 9002, closes first). argv: peer_ip"""
import socket, sys, time
p = socket.create_connection((sys.argv[1], 9001))   # starts luna (takes the first port)
t = time.time()
s = socket.create_connection((sys.argv[1], 9002), timeout=30)
c = time.time() - t
n = 0
while True:
    d = s.recv(1 << 20)
    if not d: break
    n += len(d)
print(f"local port {s.getsockname()[1]}: connect {c:.2f}s, {n} bytes", flush=True)
s.close(); p.close()
