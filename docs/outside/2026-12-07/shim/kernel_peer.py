"""Kernel-side peer servers (run in the tap namespace WITHOUT the shim), bound to 198.18.0.1.
Each port is one behaviour the luna client tests against."""
import socket, struct, sys, threading, time

HOST = sys.argv[1] if len(sys.argv) > 1 else "198.18.0.1"

def serve(port, handler):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND: the tap comes and goes with the DPDK process
    s.bind((HOST, port)); s.listen(64)
    def loop():
        while True:
            c, _ = s.accept()
            threading.Thread(target=wrap, args=(handler, c), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()

def wrap(h, c):
    try:
        h(c)
    except Exception as e:
        print("peer handler", h.__name__, "error", e, flush=True)
    finally:
        try: c.close()
        except Exception: pass

def echo(c):
    while True:
        d = c.recv(65536)
        if not d: return
        c.sendall(d)

def source(c):           # 9002: 1 MiB pattern then close
    c.sendall(bytes(range(256)) * 4096)

def rst(c):              # 9003: read 10 bytes then RST
    c.recv(10)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

def halfclose(c):        # 9004: read to EOF counting, while sending 2 MiB; then report count
    n = 0
    sender = threading.Thread(target=lambda: c.sendall(b"x" * (2 << 20)))
    sender.start()
    while True:
        d = c.recv(65536)
        if not d: break
        n += len(d)
    sender.join()
    c.sendall(b"COUNT %d\n" % n)

def slowread(c):         # 9005: don't read for 6 s then drain
    time.sleep(6)
    while c.recv(65536): pass

def peerfin(c):          # 9006: send "bye", SHUT_WR, then read to EOF, then send nothing
    c.sendall(b"bye")
    c.shutdown(socket.SHUT_WR)
    n = 0
    while True:
        d = c.recv(65536)
        if not d: break
        n += len(d)
    print("9006 got", n, flush=True)

def delayed(c):          # 9007: wait 1.5 s then send "late" and close
    time.sleep(1.5)
    c.sendall(b"late")

def linesrv(c):          # 9008: line protocol: reply each line uppercased
    f = c.makefile("rwb")
    for line in f:
        f.write(line.upper()); f.flush()

def chunks(c):           # 9009: send 100 bytes in 10 chunks 50 ms apart then close
    for i in range(10):
        c.sendall(bytes([65 + i]) * 10); time.sleep(0.05)

for port, h in [(9001, echo), (9002, source), (9003, rst), (9004, halfclose), (9005, slowread),
                (9006, peerfin), (9007, delayed), (9008, linesrv), (9009, chunks)]:
    serve(port, h)
print("peer ready", flush=True)
while True:
    time.sleep(3600)
