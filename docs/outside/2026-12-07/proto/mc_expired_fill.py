#!/usr/bin/python3
"""luna-kv never reclaims expired items: they keep counting against --memory-mb until
someone reads their exact key, so a store full of dead items refuses every new set.
memcached reclaims expired items (LRU tail / crawler) and stores.
Usage: mc_expired_fill.py HOST PORT [MB]"""
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
mb = int(sys.argv[3]) if len(sys.argv) > 3 else 8
s = socket.create_connection((host, port), timeout=10)
f = s.makefile("rb")
val = b"x" * 100_000
n_ok = 0
for i in range(mb * 10 + 20):          # more than the limit, all with exptime 1 s
    s.sendall(b"set dead%d 0 1 %d\r\n%s\r\n" % (i, len(val), val))
    r = f.readline()
    if r == b"STORED\r\n":
        n_ok += 1
    else:
        print("set", i, "->", r)
        break
print("stored with exptime=1:", n_ok)
time.sleep(2.5)
s.sendall(b"get dead0\r\n"); print("get dead0 (expired) ->", f.readline())
s.sendall(b"stats\r\n")
while True:
    l = f.readline()
    if l.startswith(b"STAT bytes ") or l.startswith(b"STAT curr_items") or l.startswith(b"STAT limit_maxbytes"):
        print(l.strip().decode())
    if l == b"END\r\n":
        break
fails = 0
for i in range(20):
    s.sendall(b"set live%d 0 0 %d\r\n%s\r\n" % (i, len(val), val))
    r = f.readline()
    if r != b"STORED\r\n":
        fails += 1
print("new sets after expiry: %d/20 refused, last reply %r" % (fails, r))
