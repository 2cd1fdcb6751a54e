"""A kernel echo server (no preload): echoes every connection until its FIN, then
closes. argv: ip port ready_file seconds"""
import socket
import sys
import threading
import time

ip, port, ready, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((ip, port))
s.listen(16)
s.settimeout(1)
open(ready, "w").write("ready")


def echo(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                return
            c.sendall(d)


end = time.time() + secs
while time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    threading.Thread(target=echo, args=(c,), daemon=True).start()
