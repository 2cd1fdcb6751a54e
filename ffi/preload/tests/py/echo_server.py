"""A kernel echo server (no preload): echoes every connection until its FIN, then
closes. How each connection ended ("fin" or "reset") is kept by the client's port and
told on port + 2 (a connection there sends a port number and gets the word back, or
"open" while that connection lives; "tos PORT" gets the TOS byte of that connection's
handshake). Sinks on port + 3 and port + 4 read a connection
after a pause (0.3 s, 1.5 s), with a small receive buffer (the sender's queue fills), and
write how it ended and the bytes they got ("fin 4194304") to ready_file + ".sink" and
".sink2". Port + 5 never reads.
argv: ip port ready_file seconds"""
import socket
import struct
import sys
import threading
import time

ip, port, ready, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
ends = {}
# The TOS byte of each echo connection's handshake (its last ACK), by the client's port:
# asked on port + 2 as "tos PORT".
toss = {}
IP_PKTOPTIONS, IP_RECVTOS = 9, 13


def listener(p, rcvbuf=None):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((ip, p))
    s.listen(16)
    s.settimeout(1)
    return s


s = listener(port)
s.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
status = listener(port + 2)
sinks = [(listener(port + 3, 64 << 10), 0.3, ".sink"), (listener(port + 4, 64 << 10), 1.5, ".sink2")]
stuck = listener(port + 5, 64 << 10)
open(ready, "w").write("ready")


def tos_of(c):
    """The TOS the kernel kept from the handshake (a cmsg IP_TOS in IP_PKTOPTIONS)."""
    b = c.getsockopt(socket.IPPROTO_IP, IP_PKTOPTIONS, 64)
    while len(b) >= 17:
        n, level, kind = struct.unpack("=QII", b[:16])
        if level == socket.IPPROTO_IP and kind == socket.IP_TOS:
            return b[16]
        b = b[(n + 7) & ~7:]
    return None


def echo(c, peer_port):
    toss[peer_port] = tos_of(c)
    with c:
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    ends[peer_port] = "fin"
                    return
                c.sendall(d)
        except ConnectionResetError:
            ends[peer_port] = "reset"


def tell():
    while time.time() < end:
        try:
            c, _ = status.accept()
        except socket.timeout:
            continue
        with c:
            c.settimeout(5)
            try:
                q = c.recv(16).decode()
                if q.startswith("tos "):
                    c.sendall(str(toss.get(int(q[4:]))).encode())
                else:
                    c.sendall(ends.get(int(q), "open").encode())
            except (OSError, ValueError):
                pass


def drain(sink, pause, name):
    while time.time() < end:
        try:
            c, _ = sink.accept()
        except socket.timeout:
            continue
        with c:
            time.sleep(pause)
            n, how = 0, "reset"
            try:
                while True:
                    d = c.recv(65536)
                    if not d:
                        how = "fin"
                        break
                    n += len(d)
            except ConnectionResetError:
                pass
            open(ready + name, "w").write("%s %d" % (how, n))


def never_read():
    """Port + 5: connections never read (their window closes and stays shut); how each
    ended is told on port + 2 like the echo connections' ("reset" once the kernel saw
    a RST; "open" until then)."""
    while time.time() < end:
        try:
            c, peer = stuck.accept()
        except socket.timeout:
            continue
        threading.Thread(target=watch, args=(c, peer[1]), daemon=True).start()


def watch(c, peer_port):
    with c:
        while time.time() < end:
            if c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                ends[peer_port] = "reset"
                return
            time.sleep(0.05)


end = time.time() + secs
threading.Thread(target=never_read, daemon=True).start()
threading.Thread(target=tell, daemon=True).start()
for a in sinks:
    threading.Thread(target=drain, args=a, daemon=True).start()
while time.time() < end:
    try:
        c, peer = s.accept()
    except socket.timeout:
        continue
    threading.Thread(target=echo, args=(c, peer[1]), daemon=True).start()
