#!/usr/bin/python3
"""Concurrent unary calls with messages within luna-grpc's 256 KiB limit on one channel
stall: once more than max_buffered (4 MiB) of incomplete request bodies are buffered the
session stops returning connection window, and no body can complete without window.
Usage: grpc_concurrent_upload_stall.py HOST:PORT [N] [SIZE]"""
import sys, time, grpc
n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
size = int(sys.argv[3]) if len(sys.argv) > 3 else 250_000
ch = grpc.insecure_channel(sys.argv[1])
echo = ch.unary_unary("/luna.Echo/Echo")
echo(b"warm", timeout=5)
t0 = time.time()
futs = [echo.future(bytes([i % 256]) * size, timeout=15) for i in range(n)]
ok = failed = 0
for f in futs:
    try:
        f.result(); ok += 1
    except grpc.RpcError as e:
        failed += 1; code = e.code()
print(f"{n} concurrent calls of {size} bytes: {ok} ok, {failed} failed" + (f" ({code})" if failed else "") + f" in {time.time()-t0:.1f}s")
