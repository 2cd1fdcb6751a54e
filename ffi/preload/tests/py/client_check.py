"""Runs under LD_PRELOAD=libluna-preload.so (Debian's python3): luna as a client of a
kernel echo server, each call's result checked. Prints one `OK ...` line at the end.

argv: luna_ip kernel_ip echo_port ready_file
"""
import os
import select
import socket
import sys
import time

luna_ip, kernel_ip, port, ready = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print("FAIL", what, flush=True)
        sys.exit(1)
    checks += 1


# A luna listener starts the engine (DPDK creates the tap); closing it stops listening.
lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind((luna_ip, 7001))
lst.listen(16)
check(lst.getsockname() == (luna_ip, 7001), "listener address")
check(lst.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1, "SO_ACCEPTCONN")
lst.setblocking(False)
try:
    lst.accept()
    check(False, "accept without a connection")
except BlockingIOError:
    check(True, "")
lst.close()

deadline = time.time() + 120
while not os.path.exists(ready):
    check(time.time() < deadline, "the echo server never came up")
    time.sleep(0.05)

# UNIX sockets stay in the kernel.
a, b = socket.socketpair()
a.sendall(b"unix")
check(b.recv(4) == b"unix", "socketpair")

# Blocking connect through luna, bytes echoed back.
c = socket.socket()
c.connect((kernel_ip, port))
check(c.getpeername() == (kernel_ip, port), "getpeername")
check(c.getsockname()[0] == luna_ip, "getsockname %r" % (c.getsockname(),))
check(c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0, "SO_ERROR")
check(c.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM, "SO_TYPE")
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
check(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1, "TCP_NODELAY")
payload = bytes(range(256)) * 1024  # 256 KiB
c.sendall(payload)
got = bytearray()
while len(got) < len(payload):
    d = c.recv(65536)
    check(d, "early end of stream")
    got += d
check(bytes(got) == payload, "echoed bytes")

# One epoll set with a kernel pipe and the luna socket.
r, w = os.pipe()
ep = select.epoll()
ep.register(r, select.EPOLLIN)
ep.register(c.fileno(), select.EPOLLIN)
check(ep.poll(0.2) == [], "nothing ready")
os.write(w, b"k")
check(ep.poll(5) == [(r, select.EPOLLIN)], "the pipe alone")
os.read(r, 1)
c.sendall(b"again")
ev = []
end = time.time() + 10
while not ev and time.time() < end:
    ev = ep.poll(5)
check(ev == [(c.fileno(), select.EPOLLIN)], "the luna socket alone: %r" % ev)
time.sleep(0.2)
check(c.recv(16) == b"again", "epoll data")
ep.modify(c.fileno(), select.EPOLLOUT)
check(ep.poll(5) == [(c.fileno(), select.EPOLLOUT)], "writable")
ep.unregister(c.fileno())
check(ep.poll(0) == [], "unregistered")

# Non-blocking reads.
c.setblocking(False)
try:
    c.recv(16)
    check(False, "recv with nothing queued")
except BlockingIOError:
    check(True, "")
c.setblocking(True)

# poll(2) on a luna socket.
p = select.poll()
p.register(c.fileno(), select.POLLIN)
c.sendall(b"polled")
res = p.poll(10000)
check(res and res[0][0] == c.fileno() and res[0][1] & select.POLLIN, "poll %r" % res)
check(c.recv(16, socket.MSG_PEEK) != b"", "MSG_PEEK")
buf = bytearray()
while len(buf) < 6:
    buf += c.recv(16)
check(bytes(buf) == b"polled", "poll data")

# Half close: the echo server answers the FIN with its own.
c.shutdown(socket.SHUT_WR)
try:
    c.send(b"x")
    check(False, "send after shutdown")
except BrokenPipeError:
    check(True, "")
check(c.recv(16) == b"", "end of stream")
c.close()

# Nobody listens on port + 1: refused.
d = socket.socket()
try:
    d.connect((kernel_ip, port + 1))
    check(False, "connect to a closed port")
except ConnectionRefusedError:
    check(True, "")
d.close()

# Loopback stays in the kernel.
k = socket.socket()
k.bind(("127.0.0.1", 0))
k.listen(1)
kc = socket.create_connection(k.getsockname())
ks, _ = k.accept()
kc.sendall(b"lo")
check(ks.recv(2) == b"lo", "loopback")

print("OK checks=%d" % checks, flush=True)
