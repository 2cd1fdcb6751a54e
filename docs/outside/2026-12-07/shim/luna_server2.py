"""Under the shim: servers for kernel_client2.py. argv: ip seconds"""
import errno, os, select, socket, struct, sys, threading, time
IP = sys.argv[1]
def listener(port, backlog=128):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((IP, port)); l.listen(backlog); return l
def echo(c):
    try:
        while True:
            d = c.recv(65536)
            if not d: break
            c.sendall(d)
    except OSError as e:
        print("echo", errno.errorcode.get(e.errno), flush=True)
    finally:
        c.close()
# 8101: backlog 4, slow accept (20 ms each)
def slow():
    l = listener(8101, 4)
    while True:
        c, _ = l.accept(); threading.Thread(target=echo, args=(c,), daemon=True).start(); time.sleep(0.02)
threading.Thread(target=slow, daemon=True).start()
# 8102: 4 threads blocked in accept on one listener; each counts
counts = [0] * 4
l2 = listener(8102)
def acc(i):
    while True:
        c, _ = l2.accept(); counts[i] += 1; echo(c)
for i in range(4): threading.Thread(target=acc, args=(i,), daemon=True).start()
# 8103: server writes 8 MiB to a client that resets mid-way; reports the error it got
def writer():
    l = listener(8103)
    while True:
        c, _ = l.accept()
        def w(c):
            sent = 0
            try:
                while sent < (64 << 20):
                    sent += c.send(b"w" * 65536)
                print("8103 wrote all", sent, flush=True)
            except OSError as e:
                print("8103 send error", errno.errorcode.get(e.errno), "after", sent, flush=True)
            c.close()
        threading.Thread(target=w, args=(c,), daemon=True).start()
threading.Thread(target=writer, daemon=True).start()
# 8104: 3 threads, one epoll set each, EPOLLEXCLUSIVE on one non-blocking listener
l4 = listener(8104); l4.setblocking(False)
ecounts = [0] * 3
def ex(i):
    ep = select.epoll(); ep.register(l4, select.EPOLLIN | select.EPOLLEXCLUSIVE)
    while True:
        for fd, ev in ep.poll(1):
            try:
                c, _ = l4.accept()
            except BlockingIOError:
                continue
            ecounts[i] += 1; c.setblocking(True)
            threading.Thread(target=echo, args=(c,), daemon=True).start()
for i in range(3): threading.Thread(target=ex, args=(i,), daemon=True).start()
# 8105: server reads 5 bytes then closes without reading the rest (RST expected by Linux rules)
def unread():
    l = listener(8105)
    while True:
        c, _ = l.accept(); c.recv(5); time.sleep(0.2); c.close()
threading.Thread(target=unread, daemon=True).start()
print("ready", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    time.sleep(0.5)
print("accept counts per thread", counts, "EPOLLEXCLUSIVE counts", ecounts, flush=True)
os._exit(0)
