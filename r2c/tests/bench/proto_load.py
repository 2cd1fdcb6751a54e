#!/usr/bin/python3
"""Closed-loop load for the protocol benchmarks (r2c/tests/proto_bench.sh): CONNS
connections, each sending REQS requests one after another and checking every reply.

Usage: proto_load.py memcached|grpc HOST PORT CONNS REQS
Prints 'LOAD ok proto=P conns=C requests=N errors=E timeouts=T secs=S rps=R p50_us=..
p99_us=.. p999_us=..' (latency per request, from send to the whole reply). Exits 1 if
any reply was wrong or missing. Bounded: REQS per connection, a timeout on every request
(PROTO_LOAD_TIMEOUT seconds, default 30). A memcached request that times out, or a
connection that breaks, ends only its own connection: it is counted (`timeouts`; its
unfinished requests as `errors`) and the other connections go on, so the LOAD line is
printed either way (before, one timeout aborted the whole client without one).
"""
import asyncio
import os
import resource
import sys
import time

proto, host, port, conns, reqs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
TIMEOUT = float(os.environ.get("PROTO_LOAD_TIMEOUT", "30"))
lat = []
errors = 0
timeouts = 0

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, conns * 2 + 256)), hard))


async def mc_conn(i):
    global errors, timeouts
    for attempt in range(50):
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), TIMEOUT)
            break
        except OSError:
            await asyncio.sleep(0.05 * (attempt + 1))
    else:
        errors += reqs
        return
    key = b"bench%d" % (i % 1000)
    val = b"v" * 32
    want = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(val), val)
    done = 0
    try:
        w.write(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(val), val))
        if await asyncio.wait_for(r.readline(), TIMEOUT) != b"STORED\r\n":
            errors += 1
        for _ in range(reqs):
            t = time.perf_counter()
            w.write(b"get %s\r\n" % key)
            got = await asyncio.wait_for(r.readexactly(len(want)), TIMEOUT)
            lat.append(time.perf_counter() - t)
            done += 1
            if got != want:
                errors += 1
    except asyncio.TimeoutError:
        # The stream is out of step now (a reply is owed): end this connection only.
        timeouts += 1
        errors += reqs - done
    except (OSError, asyncio.IncompleteReadError):
        errors += reqs - done
    w.close()


async def grpc_conn(i):
    global errors
    import grpc

    # A channel of its own per connection (no shared subchannel).
    async with grpc.aio.insecure_channel(
        "%s:%d" % (host, port), options=[("grpc.use_local_subchannel_pool", 1)]
    ) as ch:
        echo = ch.unary_unary("/luna.Echo/Echo")
        msg = b"m" * 64
        for _ in range(reqs):
            t = time.perf_counter()
            try:
                got = await echo(msg, timeout=TIMEOUT)
            except Exception:
                errors += 1
                continue
            lat.append(time.perf_counter() - t)
            if got != msg:
                errors += 1


async def main():
    f = mc_conn if proto == "memcached" else grpc_conn
    t = time.perf_counter()
    await asyncio.gather(*(f(i) for i in range(conns)))
    return time.perf_counter() - t


secs = asyncio.run(main())
lat.sort()


def pct(p):
    return int(lat[min(len(lat) - 1, int(len(lat) * p))] * 1e6) if lat else -1


n = len(lat)
print(
    f"LOAD {'ok' if errors == 0 else 'FAIL'} proto={proto} conns={conns} requests={n} errors={errors} timeouts={timeouts} "
    f"secs={secs:.2f} rps={n / secs:.0f} p50_us={pct(0.5)} p99_us={pct(0.99)} p999_us={pct(0.999)}"
)
sys.exit(0 if errors == 0 else 1)
