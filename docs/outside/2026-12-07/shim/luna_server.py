"""Runs under the shim: several servers on luna's address (argv[1]); kernel_client.py drives them."""
import asyncio, os, selectors, socket, socketserver, struct, sys, threading, time
IP = sys.argv[1]

# 8001 asyncio streams echo
async def aecho(r, w):
    try:
        while True:
            d = await r.read(65536)
            if not d: break
            w.write(d); await w.drain()
        w.close(); await w.wait_closed()
    except Exception as e:
        print("aecho error", repr(e), flush=True)
async def amain():
    srv = await asyncio.start_server(aecho, IP, 8001, backlog=128)
    async with srv: await srv.serve_forever()
threading.Thread(target=lambda: asyncio.run(amain()), daemon=True).start()

# 8002 socketserver.ThreadingTCPServer with StreamRequestHandler (rfile/wfile = makefile)
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(line.upper())
class TS(socketserver.ThreadingTCPServer):
    allow_reuse_address = True; daemon_threads = True; request_queue_size = 128
ts = TS((IP, 8002), H)
threading.Thread(target=ts.serve_forever, daemon=True).start()

# 8003 selectors (epoll) non-blocking echo
def selsrv():
    sel = selectors.DefaultSelector()
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((IP, 8003)); ls.listen(128); ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ)
    pend = {}
    while True:
        for key, ev in sel.select():
            s = key.fileobj
            if s is ls:
                try:
                    c, _ = ls.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False); pend[c] = b""
                sel.register(c, selectors.EVENT_READ)
                continue
            if ev & selectors.EVENT_READ:
                try:
                    d = s.recv(65536)
                except BlockingIOError:
                    d = None
                except ConnectionError:
                    d = b""
                if d == b"":
                    sel.unregister(s); s.close(); pend.pop(s, None); continue
                if d:
                    pend[s] += d
            if pend.get(s):
                try:
                    n = s.send(pend[s]); pend[s] = pend[s][n:]
                except BlockingIOError:
                    pass
                except ConnectionError:
                    sel.unregister(s); s.close(); pend.pop(s, None); continue
            if s in pend:
                sel.modify(s, selectors.EVENT_READ | (selectors.EVENT_WRITE if pend[s] else 0))
threading.Thread(target=selsrv, daemon=True).start()

# 8004 server sends 5 MiB, SHUT_WR, then reads client's bytes to EOF and prints the count
def halfsrv():
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((IP, 8004)); ls.listen(8)
    while True:
        c, _ = ls.accept()
        def h(c):
            c.sendall(b"s" * (5 << 20)); c.shutdown(socket.SHUT_WR)
            n = 0
            while True:
                d = c.recv(65536)
                if not d: break
                n += len(d)
            print("8004 server read", n, flush=True); c.close()
        threading.Thread(target=h, args=(c,), daemon=True).start()
threading.Thread(target=halfsrv, daemon=True).start()

# 8006 address report
def addrsrv():
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", 8006)); ls.listen(8)
    while True:
        c, a = ls.accept()
        c.sendall(f"{a} {c.getpeername()} {c.getsockname()} {ls.getsockname()}\n".encode()); c.close()
threading.Thread(target=addrsrv, daemon=True).start()

# 8007 RST on accept
def rstsrv():
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((IP, 8007)); ls.listen(8)
    while True:
        c, a = ls.accept()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
threading.Thread(target=rstsrv, daemon=True).start()

# 8009 server closes first (TIME_WAIT on our side), then in-process restart of the listener
def restartsrv():
    for gen in range(3):
        ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            ls.bind((IP, 8009)); ls.listen(8)
        except OSError as e:
            print("8009 rebind gen", gen, "failed:", e, flush=True); return
        c, _ = ls.accept(); c.sendall(b"gen%d\n" % gen); c.close(); ls.close()
        print("8009 gen", gen, "served", flush=True)
threading.Thread(target=restartsrv, daemon=True).start()

print("servers ready", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 300)
os._exit(0)
