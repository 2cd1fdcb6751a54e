#!/usr/bin/python3
"""A real meta-protocol client against a server: meta-memcache (PyPI `meta-memcache` 4.3,
Revolut's pure-Python client, which speaks only mg/ms/md/ma/mn). Every call's result is
checked; run it against memcached 1.6.18 too, to check the expectations.

Usage: mc_meta_client.py HOST PORT   (pip install meta-memcache; a venv is fine)
"""
import os, sys, time
from meta_memcache import (CacheClient, Key, LeasePolicy, RecachePolicy, ServerAddress,
                           SetMode, StalePolicy, connection_pool_factory_builder)

host, port = sys.argv[1], int(sys.argv[2])
c = CacheClient.cache_client_from_servers(
    servers=[ServerAddress(host=host, port=port)],
    connection_pool_factory_fn=connection_pool_factory_builder(),
)
run = os.urandom(3).hex()
K = lambda n: Key(run + n)
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        print("FAIL", what)
        sys.exit(1)


check(c.get(K("miss")) is None, "miss")
check(c.set(K("a"), {"x": [1, 2]}, ttl=100), "set")
check(c.get(K("a")) == {"x": [1, 2]}, "get pickled")
check(c.set(K("s"), "text", ttl=0) and c.get(K("s")) == "text", "str")
check(c.set(K("b"), b"\x00\xffbin", ttl=0) and c.get(K("b")) == b"\x00\xffbin", "bytes")
big = os.urandom(300_000)
check(c.set(K("big"), big, ttl=0) and c.get(K("big")) == big, "300 kB value")
# A key with spaces/binary goes base64 (`b`) in this client.
check(c.set(Key("sp ace é" + run), 5, ttl=0) and c.get(Key("sp ace é" + run)) == 5, "b64 key")
check(c.set(K("nr"), 7, ttl=0, no_reply=True), "noreply set")
check(c.get(K("nr")) == 7, "get after noreply set")
# CAS.
v, cas = c.get_cas(K("a"))
check(v == {"x": [1, 2]} and cas, "get_cas")
check(c.set(K("a"), "new", ttl=100, cas_token=cas), "set with matching cas")
check(not c.set(K("a"), "newer", ttl=100, cas_token=cas), "stale cas refused")
check(c.get(K("a")) == "new", "value after cas")
# Modes.
check(not c.set(K("a"), "x", ttl=0, set_mode=SetMode.ADD), "add existing")
check(c.set(K("add"), "x", ttl=0, set_mode=SetMode.ADD), "add new")
check(not c.set(K("rep"), "x", ttl=0, set_mode=SetMode.REPLACE), "replace missing")
check(c.set(K("add"), "y", ttl=0, set_mode=SetMode.REPLACE) and c.get(K("add")) == "y", "replace")
check(c.set(K("ap"), b"ab", ttl=0) and c.set(K("ap"), b"cd", ttl=0, set_mode=SetMode.APPEND), "append")
check(c.set(K("ap"), b"__", ttl=0, set_mode=SetMode.PREPEND) and c.get(K("ap")) == b"__abcd", "prepend")
# Touch, delete, invalidate.
check(c.touch(K("a"), 50), "touch")
check(not c.touch(K("nope"), 50), "touch missing")
check(c.delete(K("a")) and c.get(K("a")) is None, "delete")
check(not c.delete(K("a")), "delete missing")
check(c.invalidate(K("a")), "invalidate missing")
# Counters.
check(c.delta(K("n"), 1) is False, "delta missing")
check(c.delta_initialize(K("n"), 5, initial_value=10, initial_ttl=100), "delta_initialize")
check(c.delta_and_get(K("n"), 5) == 15, "delta_and_get")
check(c.delta_and_get(K("n"), -20) == 0, "decrement floors at 0")
check(c.delta_initialize_and_get(K("n2"), 1, initial_value=41, initial_ttl=0) == 41, "init and get")
check(c.delta_initialize_and_get(K("n2"), 1, initial_value=41, initial_ttl=0) == 42, "init and get 2")
# Multi-get (pipelined quiet mg + mn inside the client).
keys = [K("m%d" % i) for i in range(20)]
for i, k in enumerate(keys[::2]):
    c.set(k, i, ttl=0)
got = c.multi_get(keys)
check(all(got[k] == i for i, k in enumerate(keys[::2])) and all(got[k] is None for k in keys[1::2]), "multi_get")
# Leases: the first miss wins (N vivifies, W), the second client sees Z until refill.
lp = LeasePolicy(ttl=30, miss_retries=1, miss_retry_wait=0.05, wait_backoff_factor=1, miss_max_retry_wait=0.1)
v, cas = c.get_or_lease_cas(K("lease"), lp)
check(v is None and cas, "lease winner gets a miss and the placeholder's CAS")
check(c.get_or_lease(K("lease"), lp) is None, "lease loser waits and misses")
check(c.set(K("lease"), "filled", ttl=100, cas_token=cas), "winner fills with its CAS")
check(c.get_or_lease(K("lease"), lp) == "filled", "filled")
check(not c.refill(K("lease"), "again", ttl=100), "refill (add) of a present key")
check(c.refill(K("lease2"), "r", ttl=100) and c.get(K("lease2")) == "r", "refill of a missing key")
# Stale-while-revalidate: md I marks stale; one client wins the recache.
sp = StalePolicy(mark_stale_on_deletion_ttl=30, mark_stale_on_cas_mismatch=True)
check(c.set(K("st"), "v1", ttl=100), "set for stale")
check(c.invalidate(K("st"), stale_policy=sp), "invalidate marks stale")
r = c.meta_get(K("st"), flags=__import__("meta_memcache").RequestFlags(return_value=True, return_ttl=True))
check(getattr(r, "flags", None) is not None and r.flags.stale and r.flags.win, "stale item: X and W")
r = c.meta_get(K("st"), flags=__import__("meta_memcache").RequestFlags(return_value=True))
check(r.flags.stale and r.flags.win is False, "second fetch: X and Z (win False)")
# Recache policy: remaining TTL under 200 s: one client wins.
check(c.set(K("rc"), "v", ttl=100), "set for recache")
r = c.meta_get(K("rc"), flags=__import__("meta_memcache").RequestFlags(return_value=True, recache_ttl=200))
check(r.flags.win, "recache win")
print("OK", checks, "checks")
