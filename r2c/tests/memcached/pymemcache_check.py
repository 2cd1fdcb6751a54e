#!/usr/bin/python3
"""pymemcache (Debian python3-pymemcache) against luna-kv: every call's result is checked.

Usage: pymemcache_check.py HOST PORT; prints "PYMEMCACHE ok checks=N" or exits 1.
"""
import sys
from pymemcache.client.base import Client
c = Client((sys.argv[1], int(sys.argv[2])), connect_timeout=5, timeout=10)
ok = 0
def check(cond, what):
    global ok
    if not cond:
        print("PYMEMCACHE-FAIL", what); sys.exit(1)
    ok += 1
check(c.set("k1", b"v1", expire=0, noreply=False), "set")
check(c.get("k1") == b"v1", "get")
big = bytes(range(256)) * 4000
check(c.set("big", big, noreply=False), "set big")
check(c.get("big") == big, "get big")
check(c.add("k1", b"x", noreply=False) is False, "add existing")
check(c.replace("nokey", b"x", noreply=False) is False, "replace missing")
check(c.append("k1", b"++", noreply=False) and c.get("k1") == b"v1++", "append")
check(c.prepend("k1", b"--", noreply=False) and c.get("k1") == b"--v1++", "prepend")
v, cas = c.gets("k1")
check(v == b"--v1++" and cas is not None, "gets")
check(c.cas("k1", b"new", cas, noreply=False) is True, "cas ok")
check(c.cas("k1", b"newer", cas, noreply=False) is False, "cas stale")
check(c.get("k1") == b"new", "after cas")
c.set("n", b"10", noreply=False)
check(c.incr("n", 5, noreply=False) == 15, "incr")
check(c.decr("n", 20, noreply=False) == 0, "decr floors")
check(c.incr("none", 1, noreply=False) is None, "incr missing")
many = {"m%d" % i: ("val%d" % i).encode() for i in range(300)}
check(c.set_many(many, noreply=False) == [], "set_many")
got = c.get_many(list(many) + ["absent"])
check(got == many, "get_many 300 keys")
check(c.delete("m0", noreply=False) is True and c.get("m0") is None, "delete")
check(c.delete("m0", noreply=False) is False, "delete missing")
check(c.touch("m1", 100, noreply=False) is True, "touch")
check(c.touch("absent", 100, noreply=False) is False, "touch missing")
c.set("exp", b"x", expire=-1, noreply=False)
check(c.get("exp") is None, "negative expiry")
c.set("fl", b"x", flags=42, noreply=False)
c2 = Client((sys.argv[1], int(sys.argv[2])), connect_timeout=5, timeout=10, deserializer=lambda k, v, f: (v, f))
check(c2.get("fl") == (b"x", 42), "flags")
c2.close()
c.set("nr", b"quiet")  # default noreply=True
check(c.get("nr") == b"quiet", "noreply set")
# The same 200 times: the get must run after the noreply set before it (memcached runs a
# connection's commands in order; under MS luna-kv once missed about 8% of them).
missed = 0
for i in range(200):
    c.set("nr%d" % i, b"q%d" % i)
    missed += c.get("nr%d" % i) != b"q%d" % i
check(missed == 0, "200 noreply sets each seen by the get after it (%d missed)" % missed)
check(c.version().startswith(b"1.6"), "version")
st = c.stats()
check(st.get(b"curr_items", 0) > 300, "stats")
check(c.flush_all(noreply=False) is True and c.get("k1") is None, "flush_all")
c.quit()
print("PYMEMCACHE ok checks=%d" % ok)
